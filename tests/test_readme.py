"""The README's Python example runs as written and shows what it claims."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(capsys):
    """Every ```python block runs; its stated shapes and the base count hold."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README lost its Python example"
    namespace = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["pe_TD"].shape == (50, 16)
    assert namespace["logits_BTV"].shape == (1, 3, 100)
    assert namespace["out_BTNH"].shape == (1, 4, 2, 8)
    # The causal + padding mask hides key 3 (padding) and the future from every query.
    weights_BNTS = np.asarray(namespace["weights_BNTS"])
    assert np.all(weights_BNTS[..., 3] == 0)
    assert np.all(np.triu(weights_BNTS[0, 0], k=1) == 0)
    cross_BNTS = np.asarray(namespace["cross_BNTS"])
    np.testing.assert_allclose(cross_BNTS[..., :3].sum(-1), 1.0, rtol=1e-6)
    assert "'total': 63082496" in capsys.readouterr().out
