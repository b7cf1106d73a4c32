"""The Markdown pages: every Python example of README.md and docs/*.md runs as written and
shows what it claims, every relative link of them and of BENCHMARKS.md resolves (the file,
and its heading for a #anchor), and the layout in docs/api.md names only files that exist.

An example is found by a line of it (its marker), not by its place, so that it can move
between pages and keep its check. A block with no check fails, unless RUNS_WITHOUT_CHECK
lists its marker with the reason.
"""

import ast
import pathlib
import re
import shutil
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # their examples run
LINKED_PAGES = [*PAGES, ROOT / "BENCHMARKS.md"]  # their links resolve


def python_blocks(page: pathlib.Path) -> list[tuple[int, str]]:
    """(line of the block's first line of code, its code) for every ```python block."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


BLOCKS = {f"{page.relative_to(ROOT)}:{line}": (page, line, code)
          for page in PAGES for line, code in python_blocks(page)}

# marker (a line of the block) -> (check(namespace, printed, folder), needs the exports)
CHECKS = {}
# marker -> why its block runs without a check
RUNS_WITHOUT_CHECK = {}


def check(marker: str, *, exports: bool = False):
    def register(function):
        CHECKS[marker] = (function, exports)
        return function
    return register


@check("pe_TD = tj.sinusoidal_encoding(jnp.arange(50), d_model=16)")
def model_example(namespace, printed, folder):
    """Shapes as stated; the causal + padding mask hides key 3 and the future; base counts
    63.1M; the peak rate, and optax's count 0 and 3999 as steps 1 and 4000."""
    assert namespace["pe_TD"].shape == (50, 16)
    assert namespace["logits_BTV"].shape == (1, 3, 100)
    assert namespace["out_BTNH"].shape == (1, 4, 2, 8)
    weights_BNTS = np.asarray(namespace["weights_BNTS"])
    assert np.all(weights_BNTS[..., 3] == 0)
    assert np.all(np.triu(weights_BNTS[0, 0], k=1) == 0)
    cross_BNTS = np.asarray(namespace["cross_BNTS"])
    np.testing.assert_allclose(cross_BNTS[..., :3].sum(-1), 1.0, rtol=1e-6)
    assert "'total': 63082496" in printed
    peak = 512**-0.5 * 4000**-0.5  # eq. 3 at step = warmup_steps
    assert namespace["peak"] == pytest.approx(peak, rel=1e-12)
    assert float(namespace["schedule"](3999)) == pytest.approx(peak, rel=1e-6)
    assert float(namespace["schedule"](0)) == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-6)


@check("best_BT, scores_B = tj.beam_search(tokens_to_logits, cache, batch_size=2, beam_size=4,")
def search_example(namespace, printed, folder):
    """Each best hypothesis scores as stated: its log-probability under the model's full
    pass (the padding id never emitted) over lp(|Y|). The example's random weights write no
    EOS, so |Y| is max_length, where α counts (tests/test_decoding.py has the EOS cases)."""
    from transformer_jax.decoding import length_penalty

    model, variables = namespace["model"], namespace["variables"]
    best_BT, scores_B = np.asarray(namespace["best_BT"]), np.asarray(namespace["scores_B"])
    assert best_BT.shape == (2, 12) and namespace["greedy_BT"].shape == (2, 12)
    assert 1 not in best_BT  # no EOS (1): 12 tokens each
    logits_BTV = np.asarray(model.apply(variables, namespace["inputs_BS"], best_BT), np.float64)
    logits_BTV[..., 0] = -np.inf  # decode_step's padding logit
    logp_BTV = logits_BTV - np.logaddexp.reduce(logits_BTV, axis=-1, keepdims=True)
    logp_B = np.take_along_axis(logp_BTV, best_BT[..., None], axis=-1).sum((1, 2))
    np.testing.assert_allclose(scores_B, logp_B / float(length_penalty(12, 0.6)), rtol=1e-4)


@check('tokenizer, splits = tjd.prepare(config.data, "runs/demo")')
def data_example(namespace, printed, folder):
    """The data example builds "small" numbers, saves the tokenizer, prepares the ids, packs
    a 64-row batch, buckets a batch within 2,048 tokens and reads the validation text."""
    assert len(namespace["train"]) == 4000 and len(namespace["pairs"]) == 200
    assert (folder / "runs" / "demo" / "tokenizer.model").exists()
    assert (folder / "runs" / "demo" / "prepared" / "train" / "manifest.json").exists()
    tokenizer, first = namespace["tokenizer"], namespace["train"][0]
    assert tokenizer.decode(first["inputs"]) and first["inputs"][-1] == 1  # text, then EOS
    batch = namespace["batch"]
    assert batch["inputs"].shape == (64, 16) and batch["targets_positions"].shape == (64, 32)
    padded = namespace["padded"]  # a bucket of 8 or of 16 tokens
    rows, length = padded["targets"].shape
    assert padded.keys() == {"inputs", "targets"} and rows * length <= 2048 < (rows + 1) * length
    assert padded["inputs"].shape == (rows, min(length, 16))
    assert (padded["targets"] != 0).any(1).all()


def assert_english_words(text: str):
    """A translation of the numbers: English number words, not empty."""
    assert re.fullmatch(r"[a-z][a-z -]*", text), repr(text)


@check('translator = ctranslate2.Translator("exports/ct2", intra_threads=2)', exports=True)
def ctranslate2_example(namespace, printed, folder):
    """CTranslate2 serves the export with sentencepiece alone and prints a translation."""
    (line,) = printed.splitlines()
    assert_english_words(line)


@check('translator = StableHLOTranslator("exports/hlo")', exports=True)
def stablehlo_example(namespace, printed, folder):
    """serve_stablehlo.py beside the export prints one translation per search."""
    beam, greedy = (ast.literal_eval(line) for line in printed.splitlines())
    for translations in beam, greedy:
        (text,) = translations
        assert_english_words(text)
    assert "transformer_jax" not in sys.modules["serve_stablehlo"].__file__


@check('manifest = export("runs/default", "exports/py-int8", fmt="ctranslate2", '
       'quantization="int8")', exports=True)
def export_example(namespace, printed, folder):
    """export() from Python: the run's last step, int8; a greedy-only stablehlo export."""
    steps, searches = printed.splitlines()
    last = max(int(p.name) for p in (folder / "runs" / "default" / "checkpoints").iterdir()
               if p.name.isdigit())
    assert steps == f"[{last}] int8" and searches == "['greedy']"
    assert sorted(p.name for p in (folder / "exports" / "hlo-greedy").glob("*.jaxexport")) == [
        "greedy_b8_s16.jaxexport", "greedy_b8_s32.jaxexport"]


def markers_in(code: str) -> list[str]:
    return [marker for marker in [*CHECKS, *RUNS_WITHOUT_CHECK] if marker in code]


def test_every_example_has_one_check():
    for name, (_, _, code) in BLOCKS.items():
        assert len(markers_in(code)) == 1, (
            f"{name}: a Python block needs one check in {__file__} (CHECKS, keyed by a line "
            f"of the block), or its line in RUNS_WITHOUT_CHECK with the reason")
    for marker in [*CHECKS, *RUNS_WITHOUT_CHECK]:
        found = [name for name, (_, _, code) in BLOCKS.items() if marker in code]
        assert len(found) == 1, f"{marker!r} marks {len(found)} Python blocks: {found}"


@pytest.fixture(scope="module")
def exports_folder(translating_run, tmp_path_factory):
    """A folder holding what docs/serving.md's examples open: exports/ct2, exports/hlo (one
    small bucket) of a model that translates as runs/default, and serve_stablehlo.py."""
    from transformer_jax.export import export

    folder = tmp_path_factory.mktemp("served")
    workdir = str(translating_run.workdir)
    try:
        import ctranslate2  # noqa: F401  (the serve extra)
        export(workdir, str(folder / "exports" / "ct2"), fmt="ctranslate2")
    except ImportError:
        pass  # its example is skipped
    export(workdir, str(folder / "exports" / "hlo"), fmt="stablehlo", batch_sizes=(1,),
           lengths=(16,))
    shutil.copy(ROOT / "transformer_jax" / "export" / "serve_stablehlo.py", folder)
    (folder / "runs").mkdir()
    (folder / "runs" / "default").symlink_to(workdir)  # what export() reads from Python
    return folder


@pytest.mark.xdist_group("docs_examples")  # exports_folder made once (--dist loadgroup)
@pytest.mark.parametrize("name", BLOCKS)
def test_example(name, request, tmp_path, monkeypatch, capsys):
    """Runs the block as a user would, from the repository root's imports, in a folder of
    its own (files go there); then its check."""
    page, line, code = BLOCKS[name]
    (marker,) = markers_in(code) or pytest.fail(f"{name} has no check")
    function, exports = CHECKS.get(marker, (None, False))
    if "ctranslate2" in code:  # it imports CTranslate2 or exports its format: the serve extra
        pytest.importorskip("ctranslate2")
    folder = request.getfixturevalue("exports_folder") if exports else tmp_path
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    request.addfinalizer(lambda: sys.modules.pop("serve_stablehlo", None))  # the folder's
    namespace = {"__name__": "__main__"}
    capsys.readouterr()
    exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
    printed = capsys.readouterr().out
    if function is not None:
        function(namespace, printed, folder)


# --- links ---------------------------------------------------------------------------------

def prose(text: str) -> str:
    """The text without fenced code blocks (whose '#' lines are not headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(page: pathlib.Path) -> set[str]:
    """GitHub's anchors of the page's headings: lowercase, punctuation dropped except
    hyphens and underscores, spaces to hyphens; a repeated one gets -1, -2, ..."""
    seen, result = {}, set()
    for heading in re.findall(r"^#{1,6} +(.*?) *#* *$", prose(page.read_text()), re.M):
        heading = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        result.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return result


def relative_links(page: pathlib.Path) -> list[str]:
    """The targets of the page's links and images that are not URLs."""
    text = re.sub(r"`[^`]*`", "", prose(page.read_text()))  # code spans are not links
    targets = re.findall(r"\]\(([^()\s]+)(?: \"[^\"]*\")?\)", text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_links_are_found():
    """The link finder sees the README's links, anchors included."""
    links = relative_links(ROOT / "README.md")
    assert "docs/curves-default.png" in links and "BENCHMARKS.md#gpu-h100-2026-11-27" in links
    assert "gpu-h100" in anchors(ROOT / "BENCHMARKS.md")
    assert "decode---peers-ctranslate2-on-the-same-weights" in anchors(ROOT / "BENCHMARKS.md")


# --- layout --------------------------------------------------------------------------------

def layout_entries() -> list[tuple[pathlib.Path, str]]:
    """(path, description) of every entry of docs/api.md's layout: a name at indent 0, 2
    or 4 (under the folder above it), then its description, continued on deeper lines."""
    text = (ROOT / "docs" / "api.md").read_text()
    block = re.search(r"^## Layout\n.*?^```\n(.*?)^```", text, re.S | re.M).group(1)
    entries, folders = [], {0: ROOT}
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if indent > 4:  # the description goes on
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
            continue
        name, _, description = line.strip().partition(" ")
        path = folders[indent] / name
        if name.endswith("/"):
            folders[indent + 2] = path
        entries.append((path, description))
    return entries


def test_layout_names_only_files_that_exist():
    entries = layout_entries()
    assert ROOT / "transformer_jax" / "data" / "packing.py" in [path for path, _ in entries]
    missing = []
    for path, description in entries:
        if not path.exists():
            missing.append(str(path.relative_to(ROOT)))
        folder = path if path.is_dir() else path.parent
        for named in re.findall(r"[\w/]+\.py\b", description):  # files its description names
            if not ((folder / named).exists() or (ROOT / named).exists()):
                missing.append(f"{named} (in {path.relative_to(ROOT)}'s description)")
    assert not missing, "docs/api.md's layout names files that do not exist: " + ", ".join(missing)
