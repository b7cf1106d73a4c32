"""The README's Python examples run as written and show what they claim."""

import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


@pytest.fixture
def run_block(tmp_path, monkeypatch):
    """Runs a block as a user would from the repository root; files go under tmp_path."""
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.chdir(tmp_path)

    def run(block):
        namespace = {}
        exec(compile(block, "README.md", "exec"), namespace)
        return namespace

    return run


def test_readme_has_the_examples():
    assert len(BLOCKS) == 2, "update this test when the README's examples change"


def test_model_example(run_block, capsys):
    """Shapes as stated; the causal + padding mask hides key 3 and the future; base counts 63.1M."""
    namespace = run_block(BLOCKS[0])
    assert namespace["pe_TD"].shape == (50, 16)
    assert namespace["logits_BTV"].shape == (1, 3, 100)
    assert namespace["out_BTNH"].shape == (1, 4, 2, 8)
    weights_BNTS = np.asarray(namespace["weights_BNTS"])
    assert np.all(weights_BNTS[..., 3] == 0)
    assert np.all(np.triu(weights_BNTS[0, 0], k=1) == 0)
    cross_BNTS = np.asarray(namespace["cross_BNTS"])
    np.testing.assert_allclose(cross_BNTS[..., :3].sum(-1), 1.0, rtol=1e-6)
    assert "'total': 63082496" in capsys.readouterr().out


def test_data_example(run_block, tmp_path):
    """The data example builds "small" numbers, saves the tokenizer, prepares the ids, packs
    a 64-row batch, buckets a batch within 2,048 tokens and reads the validation text."""
    namespace = run_block(BLOCKS[1])
    assert len(namespace["train"]) == 4000 and len(namespace["pairs"]) == 200
    assert (tmp_path / "runs" / "demo" / "tokenizer.model").exists()
    assert (tmp_path / "runs" / "demo" / "prepared" / "train" / "manifest.json").exists()
    tokenizer, first = namespace["tokenizer"], namespace["train"][0]
    assert tokenizer.decode(first["inputs"]) and first["inputs"][-1] == 1  # text, then EOS
    batch = namespace["batch"]
    assert batch["inputs"].shape == (64, 16) and batch["targets_positions"].shape == (64, 32)
    padded = namespace["padded"]  # a bucket of 8 or of 16 tokens
    rows, length = padded["targets"].shape
    assert padded.keys() == {"inputs", "targets"} and rows * length <= 2048 < (rows + 1) * length
    assert padded["inputs"].shape == (rows, min(length, 16)) and (padded["targets"] != 0).any(1).all()
