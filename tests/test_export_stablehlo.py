"""The stablehlo export: its searches give predict.py's ids, served in-process and by the
self-contained serve_stablehlo.py in a process that cannot import transformer_jax or flax;
another checkpoint served by replacing params.npz; its one-line errors; its params.npz."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from run_configs import ROOT
from transformer_jax.data import load_split
from transformer_jax.export import export, serve_stablehlo
from transformer_jax.export.engines import open_engine
from transformer_jax.export.manifest import (MANIFEST_FILE, ExportError, check_output,
                                             staged_directory)
from transformer_jax.export.serve_stablehlo import StableHLOError, StableHLOTranslator
from transformer_jax.export.stablehlo import export_stablehlo, portable_config
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config
from transformer_jax.predict import predict
from transformer_jax.trained_params import TrainedParams, load_trained_params
from transformer_jax.translation import SentenceTooLongError, TranslationError, Translator

# In one worker (make test's --dist loadgroup): the exports and translators are made once.
pytestmark = pytest.mark.xdist_group("stablehlo")

# Buckets equal to the shapes predict.py gives the chosen sources (`sources` below): 4 rows,
# source lengths padded to 8 and to 16. Then each exported search runs with the
# max_length predict.py uses (padded length + max_extra_length) on batches of the same
# shape, so the ids must be identical, not merely close.
BATCH_SIZES, LENGTHS = (4,), (8, 16)


@pytest.fixture(scope="module")
def translator(trained_run):
    return Translator.from_workdir(str(trained_run.workdir))


@pytest.fixture(scope="module")
def exported(trained_run, translator, tmp_path_factory):
    """The shared run exported once, as `python -m transformer_jax.export` writes it."""
    output = tmp_path_factory.mktemp("stablehlo") / "exported"
    export(str(trained_run.workdir), str(output), fmt="stablehlo", batch_sizes=BATCH_SIZES,
           lengths=LENGTHS)
    return output


@pytest.fixture(scope="module")
def reweighted(exported, translator, sources, tmp_path_factory):
    """(a copy of the export serving other weights, a Translator with those weights).

    The run trained 4 steps writes one token for every source (greedy search) or ends at
    once (beam search), so equal outputs would not show that each source reached its
    own row. Its weights plus noise translate each source differently: the first noise
    (seeds 0, 1, ...) under which greedy search gives at least 6 different outputs for the
    8 sources and beam search other outputs than greedy. They go into the copy's
    params.npz, as another checkpoint of the same model would be served.
    """
    leaves, treedef = jax.tree.flatten(translator.params)
    for seed in range(20):
        keys = jax.random.split(jax.random.key(seed), len(leaves))
        noisy = [leaf + 0.5 * jax.random.normal(key, leaf.shape)
                 for leaf, key in zip(leaves, keys)]
        other = dataclasses.replace(translator, params=jax.tree.unflatten(treedef, noisy))
        if tells_apart(other, sources[1]):
            break
    else:
        pytest.fail("no noise of seeds 0-19 made the searches tell the sources apart")
    directory = tmp_path_factory.mktemp("reweighted") / "exported"
    shutil.copytree(exported, directory)
    with np.load(exported / "params.npz") as npz:
        names = sorted(npz.files)
    np.savez(directory / "params.npz", **{n: np.asarray(leaf) for n, leaf in zip(names, noisy)})
    return directory, other


def tells_apart(translator, source_ids) -> bool:
    beam_size = translator.search_settings()["beam_size"]
    greedy, beam = (predicted(translator, source_ids, k) for k in (1, beam_size))
    return len({tuple(output) for output in greedy}) >= 6 and greedy != beam


@pytest.fixture(scope="module")
def sources(trained_run, translator):
    """8 sources (text, ids with EOS) from the test split: 4 of at most 8 tokens (the
    batch of the shortest, padded to 8), 4 of 9 to 16 (a batch padded to 16). Its sentences
    have at most 8 tokens; two of them joined by a space make the longer ones. Given in
    mixed order: the searches sort them by length and return them in this order."""
    single = [pair["source"] for pair in load_split(trained_run.config.data, "test").pairs]
    texts = single + [f"{a} {b}" for a, b in zip(single[::2], single[1::2])]
    ids = translator.tokenizer.encode_batch(texts, add_eos=True)
    short = [i for i, x in enumerate(ids) if len(x) <= 8][:4]
    long = [i for i, x in enumerate(ids) if 8 < len(x) <= 16][:4]
    assert len(short) == len(long) == 4, "too few sources of these lengths"
    chosen = [long[0], short[0], long[1], short[1], short[2], long[2], short[3], long[3]]
    return [texts[i] for i in chosen], [ids[i] for i in chosen]


def predicted(translator, source_ids, beam_size: int) -> list[list[int]]:
    search = translator.search_settings(beam_size=beam_size)
    outputs = predict(translator.model, translator.params, source_ids, batch_size=4, **search)
    return [output.tolist() for output in outputs]


def test_export_lists_every_search_and_bucket(exported, translator):
    manifest = json.loads((exported / "export.json").read_text())
    entry = manifest["stablehlo"]
    assert manifest["format"] == "stablehlo"
    assert "cpu" in entry["platforms"]
    assert entry["attention_implementation"] == "xla"
    assert StableHLOTranslator(exported).searches == entry["searches"]
    beam = translator.search_settings()["beam_size"]
    assert {n: s["beam_size"] for n, s in entry["searches"].items()} == {"greedy": 1,
                                                                        "beam": beam}
    for search in entry["searches"].values():
        shapes = [(b["batch_size"], b["length"], b["max_length"]) for b in search["buckets"]]
        extra = search["max_extra_length"]
        assert shapes == [(4, 8, 8 + extra), (4, 16, 16 + extra)]
        for bucket in search["buckets"]:
            artifact = jax.export.deserialize(bytearray((exported / bucket["file"]).read_bytes()))
            assert list(artifact.platforms) == entry["platforms"]
            assert artifact.out_avals[0].shape == (4, bucket["max_length"])


def test_params_npz_holds_the_trained_parameters(exported, trained_run):
    leaves = jax.tree.leaves(load_trained_params(str(trained_run.workdir)).params)
    with np.load(exported / "params.npz") as npz:
        keys = sorted(npz.files)
        assert len(keys) == len(leaves)
        for key, leaf in zip(keys, leaves):
            assert npz[key].dtype == np.float32 and npz[key].shape == leaf.shape, key
            np.testing.assert_array_equal(npz[key], np.asarray(leaf), err_msg=key)


@pytest.mark.parametrize("beam_size", [1, None])
def test_exported_searches_give_predicts_ids(reweighted, sources, beam_size):
    directory, translator = reweighted
    _, source_ids = sources
    beam = translator.search_settings(beam_size=beam_size)["beam_size"]
    outputs = StableHLOTranslator(directory).translate_ids(source_ids, beam_size=beam_size)
    assert all(output.dtype == np.int32 and output.ndim == 1 for output in outputs)
    assert [output.tolist() for output in outputs] == predicted(translator, source_ids, beam)


def test_the_exported_beam_search_has_the_runs_length_penalty(translating_run, tmp_path):
    """On the translating run, its α = 0.6 (§6.1) changes some beam-4 outputs of test
    sources of at most 8 tokens from those of α = 0; the exported beam search, in a bucket
    of predict.py's shape, gives the ids of α = 0.6, those too."""
    workdir = str(translating_run.workdir)
    ours = Translator.from_workdir(workdir)
    texts = [pair["source"] for pair in load_split(translating_run.config.data, "test").pairs]
    ids = [x for x in ours.tokenizer.encode_batch(texts, add_eos=True) if len(x) <= 8][:64]
    assert len(ids) == 64
    search = ours.search_settings()
    assert search["alpha"] == 0.6

    def searched(alpha):
        return [output.tolist() for output in predict(
            ours.model, ours.params, ids, batch_size=8, **{**search, "alpha": alpha})]

    expected = searched(0.6)
    assert expected != searched(0.0)  # 3 of these 64 differ
    export(workdir, str(tmp_path / "hlo"), fmt="stablehlo", batch_sizes=(8,), lengths=(8,))
    served = StableHLOTranslator(tmp_path / "hlo").translate_ids(ids)
    assert [output.tolist() for output in served] == expected


SERVE_SCRIPT = textwrap.dedent("""
    import importlib.abc, importlib.util, json, sys

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("transformer_jax", "flax"):
                raise ImportError(f"{name} is hidden")

    sys.meta_path.insert(0, Hide())
    for hidden in ("transformer_jax", "flax"):
        try:
            __import__(hidden)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{hidden} could be imported")
    serve_file, directory, ids, texts = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:])
    spec = importlib.util.spec_from_file_location("serve_stablehlo", serve_file)
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    translator = serve.StableHLOTranslator(directory)
    result = {str(k): [o.tolist() for o in translator.translate_ids(ids, beam_size=k)]
              for k in (1, None)}
    result["texts"] = translator.translate(texts)
    assert not {"transformer_jax", "flax"} & {m.partition(".")[0] for m in sys.modules}
    print(json.dumps(result))
""")


def test_serve_file_alone_translates_as_the_translator(reweighted, sources, tmp_path):
    directory, translator = reweighted
    texts, source_ids = sources
    texts = [texts[0], "", *texts[1:]]  # an empty line: "", unsearched, as in Translator
    script = tmp_path / "serve.py"
    script.write_text(SERVE_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), serve_stablehlo.__file__, str(directory),
         json.dumps(source_ids), json.dumps(texts)],
        cwd=tmp_path, env=os.environ.copy(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["1"] == predicted(translator, source_ids, 1)
    beam = translator.search_settings()["beam_size"]
    assert result["None"] == predicted(translator, source_ids, beam)
    assert result["texts"] == translator.translate(texts, batch_size=4)
    assert result["texts"][1] == "" and all(result["texts"][:1] + result["texts"][2:])


def one_line_error(call) -> str:
    with pytest.raises(StableHLOError) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_source_longer_than_every_bucket_is_refused_before_any_search(exported,
                                                                       monkeypatch):
    translator = StableHLOTranslator(exported)

    def no_artifact(blob):
        raise AssertionError("an artifact was read before the lengths were checked")

    monkeypatch.setattr(jax.export, "deserialize", no_artifact)
    message = one_line_error(lambda: translator.translate_ids([[5, 1], [5] * 16 + [1]]))
    assert "sentence 2 has 17 tokens" in message and "(16)" in message
    message = one_line_error(lambda: translator.translate_ids([[5] * 16 + [1]]))
    assert message.startswith("the sentence has 17 tokens") and "(16)" in message


def test_too_long_sentences_are_refused_in_the_translators_words(exported, translator):
    """max_input_length refuses as Translator does, word for word: one sentence ("the
    sentence has ...", as translate.py on a terminal sends them) and several."""
    served = StableHLOTranslator(exported)
    for sentences in (["dreihundertzweiundvierzig"], ["null", "dreihundertzweiundvierzig"]):
        with pytest.raises(TranslationError) as ours:
            translator.translate(sentences, max_input_length=2)
        assert str(ours.value).startswith("the sentence has " if len(sentences) == 1
                                          else "sentence ")
        assert one_line_error(lambda: served.translate(sentences, max_input_length=2)) == \
            str(ours.value)


def test_a_beam_size_that_was_not_exported_is_refused(exported, translator):
    beam = translator.search_settings()["beam_size"]
    message = one_line_error(
        lambda: StableHLOTranslator(exported).translate_ids([[5, 1]], beam_size=beam + 1))
    assert f"beam_size {beam + 1} was not exported" in message
    assert "1 (greedy)" in message and f"{beam} (beam)" in message


def test_one_str_is_refused_as_translator_refuses_it(exported):
    """A str would be translated character by character: a TypeError in Translator's words."""
    with pytest.raises(TypeError) as error:
        StableHLOTranslator(exported).translate("null")
    assert str(error.value) == "translate takes a list of sentences, not one str: pass [sentence]"
    with pytest.raises(TypeError) as error:  # bytes too, which would iterate into ints
        StableHLOTranslator(exported).translate(b"null")
    assert str(error.value) == (
        "translate takes a list of sentences, not one bytes: pass [sentence]")


def echoing(calls):
    """A stand-in for a bucket's compiled search: it records the bucket's file and the
    inputs' shape, and writes each row's source as its output, PAD after."""

    def run(bucket, inputs_BS):
        calls.append((bucket["file"], inputs_BS.shape))
        outputs_BT = np.zeros((bucket["batch_size"], bucket["max_length"]), np.int32)
        outputs_BT[:, :inputs_BS.shape[1]] = inputs_BS
        return outputs_BT

    return run


def test_batches_fit_the_largest_bucket_and_draw_their_progress(exported, monkeypatch,
                                                                capsys):
    """A batch_size above the largest exported one (4) is that size, as documented; it had
    searched all 6 sources at once and found no bucket. A source of exactly the longest
    bucket's 16 tokens fits it. The progress line counts batches from 1 and ends with a
    newline, after the last batch or an interruption."""
    served = StableHLOTranslator(exported)
    calls = []
    monkeypatch.setattr(served, "_run", echoing(calls))
    sources = [[5] * n + [1] for n in (3, 10, 1, 7, 15, 2)]  # 4, 11, 2, 8, 16, 3 tokens
    outputs = served.translate_ids(sources, beam_size=1, batch_size=100)
    assert calls == [("greedy_b4_s8.jaxexport", (4, 8)), ("greedy_b4_s16.jaxexport", (4, 16))]
    for source, output in zip(sources, outputs):
        assert output[:len(source)].tolist() == source and not output[len(source):].any()
    assert capsys.readouterr().err == ""
    served.translate_ids(sources, beam_size=1, batch_size=2, progress=True)
    assert capsys.readouterr().err == ("\rtranslating: batch 1/3\rtranslating: batch 2/3"
                                       "\rtranslating: batch 3/3\n")

    def interrupted(bucket, inputs_BS):
        if calls:
            raise KeyboardInterrupt
        return echoing(calls)(bucket, inputs_BS)

    calls.clear()
    monkeypatch.setattr(served, "_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        served.translate_ids(sources, beam_size=1, batch_size=2, progress=True)
    assert capsys.readouterr().err == "\rtranslating: batch 1/3\n"


def test_blank_lines_are_unsearched_and_too_long_ones_numbered_among_all(exported,
                                                                        monkeypatch):
    """Lines of whitespace alone are "" without a search, as in Translator (this tokenizer
    gives spaces pieces of their own); a too long sentence after an empty line is sentence
    2, its number among all the sentences, not among the searched ones."""
    served = StableHLOTranslator(exported)
    calls = []
    monkeypatch.setattr(served, "_run", echoing(calls))
    assert served.translate(["  ", "\t", ""]) == ["", "", ""]
    assert calls == []
    message = one_line_error(lambda: served.translate(["", " ".join(["null"] * 4)]))
    assert message.startswith("sentence 2 has ") and "(16)" in message


def test_the_smallest_bucket_has_the_fewest_cells_then_the_shortest_rows():
    """Of the buckets that hold a batch, the one of fewest rows x length; of two as small,
    the shorter (its outputs are shorter too); a batch of exactly a bucket's size fits it."""
    def bucket(batch_size, length):
        return {"batch_size": batch_size, "length": length}

    smallest = serve_stablehlo._smallest_bucket
    assert smallest([bucket(2, 16), bucket(4, 8)], 1, 5) == bucket(4, 8)  # 32 cells each
    assert smallest([bucket(8, 8), bucket(1, 16)], 1, 5) == bucket(1, 16)  # 16, not 64
    assert smallest([bucket(4, 8), bucket(4, 16)], 4, 8) == bucket(4, 8)


def test_the_engine_refuses_settings_other_than_the_exported_ones(tmp_path, monkeypatch):
    """translate.py --engine=stablehlo cannot change what was compiled: an α or a
    max_extra_length other than the exported is refused in one line, before any search;
    greedy search, asked for or the only one exported, has no α to refuse."""
    from transformer_jax.export import engines

    searched = []

    class Served:
        """A stand-in for the exported searches."""

        def __init__(self, directory):
            pass

        def translate(self, sentences, *, beam_size, **rest):
            searched.append(beam_size)
            return ["x"] * len(sentences)

    monkeypatch.setattr(serve_stablehlo, "StableHLOTranslator", Served)
    exported = {"beam_size": 4, "alpha": 0.6, "max_extra_length": 50}
    translate = engines._stablehlo(str(tmp_path), exported)
    assert translate(["null"], alpha=0.6, max_extra_length=50) == ["x"]
    for key, value in (("max_extra_length", 10), ("alpha", 1.0)):
        with pytest.raises(TranslationError) as error:
            translate(["null"], **{key: value})
        assert str(error.value) == (f"{tmp_path} was exported with {key}={exported[key]}; "
                                    f"export again with python -m transformer_jax.export "
                                    f"--{key}={value} to change it")
    assert translate(["null"], beam_size=1, alpha=1.0) == ["x"]
    greedy_only = engines._stablehlo(str(tmp_path), {**exported, "beam_size": 1})
    assert greedy_only(["null"], alpha=1.0) == ["x"]
    with pytest.raises(TranslationError, match="exported with max_extra_length=50;"):
        greedy_only(["null"], max_extra_length=10)
    assert searched == [None, 1, None]


def test_the_engine_raises_the_translators_errors(exported, translator):
    """translate.py typed into goes on after a translation's SentenceTooLongError and ends
    in one line on any other TranslationError: the stablehlo engine raises those classes,
    in the Translator's words, where serve_stablehlo's own are no TranslationError."""
    translate = open_engine("stablehlo", exported=str(exported)).translate
    sentences = ["null", "dreihundertzweiundvierzig"]
    with pytest.raises(SentenceTooLongError) as too_long:
        translate(sentences, max_input_length=2)
    with pytest.raises(SentenceTooLongError) as ours:
        translator.translate(sentences, max_input_length=2)
    assert str(too_long.value) == str(ours.value)
    with pytest.raises(TranslationError) as unexported:
        translate(["null"], beam_size=9)
    assert not isinstance(unexported.value, (StableHLOError, SentenceTooLongError))
    assert "beam_size 9 was not exported" in str(unexported.value)


def test_a_ctranslate2_export_is_refused(tmp_path):
    (tmp_path / "export.json").write_text(json.dumps({"format": "ctranslate2"}))
    assert "holds a ctranslate2 export" in one_line_error(lambda: StableHLOTranslator(tmp_path))
    (tmp_path / "export.json").write_text("{}")  # was "holds a None export"
    assert one_line_error(lambda: StableHLOTranslator(tmp_path)) == (
        f"{tmp_path / 'export.json'} holds no export's format; export again")


def test_a_missing_directory_is_refused(tmp_path):
    missing = tmp_path / "nowhere"
    message = one_line_error(lambda: StableHLOTranslator(missing))
    assert str(missing) in message and "export.json" in message


def test_translate_py_with_stablehlo_equals_jax(translating_run, tmp_path):
    """The CLIs end to end on a model that translates: python -m transformer_jax.export,
    then translate.py --engine=stablehlo writes what --engine=jax writes, greedy and beam,
    and refuses a length penalty other than the exported one in one line."""
    exported = tmp_path / "hlo"
    made = subprocess.run(
        [sys.executable, "-m", "transformer_jax.export", f"--workdir={translating_run.workdir}",
         "--format=stablehlo", f"--output={exported}", "--batch_sizes=4", "--lengths=8,16"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    assert f"--engine=stablehlo --exported={exported}" in made.stdout
    lines = "dreihundertzweiundvierzig\nnull\neinundzwanzigtausendfünf\nsiebzehn\nachtzig\n"
    for search in (["--beam_size=1"], []):
        outputs = [subprocess.run([sys.executable, "translate.py", *search, *engine],
                                  cwd=ROOT, input=lines, capture_output=True, text=True,
                                  timeout=300)
                   for engine in ([f"--workdir={translating_run.workdir}"],
                                  ["--engine=stablehlo", f"--exported={exported}"])]
        assert [o.returncode for o in outputs] == [0, 0], outputs[1].stderr
        assert outputs[1].stdout == outputs[0].stdout and len(outputs[0].stdout.split("\n")) == 6
    refused = subprocess.run([sys.executable, "translate.py", "--engine=stablehlo",
                              f"--exported={exported}", "--alpha=1.0"], cwd=ROOT,
                             input="null\n", capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 2  # the source, the error
    assert refused.stderr.endswith(f"error: {exported} was exported with alpha=0.6; export "
                                   f"again with python -m transformer_jax.export --alpha=1.0 "
                                   f"to change it\n")
    greedy = subprocess.run([sys.executable, "translate.py", "--engine=stablehlo",
                             f"--exported={exported}", "--alpha=1.0", "--beam_size=1"],
                            cwd=ROOT, input="null\n", capture_output=True, text=True,
                            timeout=300)  # greedy search has no length penalty to differ
    assert greedy.returncode == 0 and greedy.stdout.count("\n") == 1, greedy.stderr


def test_the_export_commands_help_lists_its_search_flags():
    """--beam_size, --alpha and --max_extra_length are defined in command_line.py: --help
    left them out, though a stablehlo export's error sends the user to export --alpha."""
    result = subprocess.run([sys.executable, "-m", "transformer_jax.export", "--helpshort"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", result.stdout, re.MULTILINE))
    assert listed == {"workdir", "format", "output", "checkpoint", "force", "quantization",
                      "max_positions", "batch_sizes", "lengths", "beam_size", "alpha",
                      "max_extra_length"}, result.stdout


def test_a_staged_export_replaces_the_old_one_only_when_done(tmp_path):
    """With `force`, the finished folder takes the old one's name and the old one goes; a
    block that fails leaves the old one as it was. No temporary folder stays either way."""
    output = tmp_path / "export"
    output.mkdir()
    (output / MANIFEST_FILE).write_text("{}")  # an earlier export
    with pytest.raises(RuntimeError), staged_directory(str(output), force=True) as staging:
        pathlib.Path(staging, "new.txt").write_text("new")
        raise RuntimeError("the export failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert [p.name for p in output.iterdir()] == [MANIFEST_FILE]
    with staged_directory(str(output), force=True) as staging:
        pathlib.Path(staging, "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert [p.name for p in output.iterdir()] == ["new.txt"]
    # An --output that links to the old export: the link is replaced, nothing is left over.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / MANIFEST_FILE).write_text("{}")
    (tmp_path / "current").symlink_to(tmp_path / "old")
    with staged_directory(str(tmp_path / "current"), force=True) as staging:
        pathlib.Path(staging, "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "export", "old"]
    assert [p.name for p in (tmp_path / "current").iterdir()] == ["new.txt"]
    assert not (tmp_path / "current").is_symlink()


def test_force_replaces_an_earlier_export_and_nothing_else(tmp_path, monkeypatch):
    """--force used to delete whatever --output named: an empty --output (the current
    folder), a training run, a parent folder. Each is refused, and left as it was."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    export = tmp_path / "exports" / "hlo"
    export.mkdir(parents=True)
    (export / MANIFEST_FILE).write_text("{}")
    monkeypatch.chdir(export)
    for output, message in [
            ("", "--output is empty; name the folder to write"),
            (str(run), f"--output {run} is a folder that holds other files (no "
                       f"{MANIFEST_FILE}); choose another"),
            (str(export / ".."), f"--output {export.parent} holds the current folder; writing "
                                 f"there would move it away from under this command; choose "
                                 f"another"),
            (".", f"--output {export} holds the current folder; writing there would move it "
                  f"away from under this command; choose another")]:
        with pytest.raises(ExportError) as error, staged_directory(output, force=True):
            pytest.fail("staged")
        assert str(error.value) == message
    # The current folder reached through a symlink: getcwd() names the real one.
    (tmp_path / "link").symlink_to(tmp_path / "exports")
    monkeypatch.chdir(tmp_path / "link" / "hlo")
    with pytest.raises(ExportError, match="holds the current folder"), \
            staged_directory(str(tmp_path / "link" / "hlo"), force=True):
        pytest.fail("staged")
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["run", "checkpoints", "exports", "hlo", MANIFEST_FILE, "link"])


def test_each_unusable_output_is_named_before_any_work(tmp_path):
    """--output under a file gave makedirs' "File exists", a file got the advice to pass
    --force (which then refused it), and an empty folder made for the export was refused."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("")
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / MANIFEST_FILE).write_text("{}")
    for output, message in [
            (blocker / "out" / "deeper", f"--output {blocker / 'out' / 'deeper'} cannot be made: "
                                         f"{blocker} is a file"),
            (blocker, f"--output {blocker} is a file; name a folder to write"),
            (tmp_path / "full", f"--output {tmp_path / 'full'} is a folder that holds other "
                                f"files (no {MANIFEST_FILE}); choose another"),
            (tmp_path / "earlier", f"--output {tmp_path / 'earlier'} holds an earlier export; "
                                   f"choose another or pass --force to replace it")]:
        with pytest.raises(ExportError) as error:
            check_output(str(output))
        assert str(error.value) == message
    (tmp_path / "empty").mkdir()
    assert check_output(str(tmp_path / "empty")) == str(tmp_path / "empty")
    with staged_directory(str(tmp_path / "empty")) as staging:
        pathlib.Path(staging, "new.txt").write_text("new")
    assert [p.name for p in (tmp_path / "empty").iterdir()] == ["new.txt"]


def test_exports_lower_with_implementations_every_platform_has():
    """cuDNN's attention and the Pallas layer norm (Triton calls) become XLA's and Flax's,
    which lower for every platform (a float16 model's attention the reference einsums); an
    implementation that already does is kept."""
    trained = get_model_config("tiny", attention_implementation="cudnn",
                               layer_norm_implementation="pallas")
    portable = portable_config(trained)
    assert (portable.attention_implementation, portable.layer_norm_implementation) == (
        "xla", "xla")
    assert portable_config(dataclasses.replace(
        trained, attention_implementation="reference")).attention_implementation == "reference"
    assert dataclasses.replace(portable, attention_implementation="cudnn",
                               layer_norm_implementation="pallas") == trained
    # float16: XLA's CPU backend cannot compile jax.nn's float16 attention; the reference can.
    for name in ("auto", "cudnn", "xla", "reference"):
        half = dataclasses.replace(trained, dtype="float16", attention_implementation=name)
        assert portable_config(half).attention_implementation == "reference"
    # A run with attention dropout ("auto" trains it with the reference): the search has
    # none, and XLA's attention, which cannot apply it, is the export's.
    dropping = get_model_config("tiny", attention_dropout_rate=0.1)
    portable = portable_config(dropping)
    assert (portable.attention_implementation, portable.attention_dropout_rate) == ("xla", 0.0)
    assert dataclasses.replace(portable, attention_implementation="auto",
                               attention_dropout_rate=0.1) == dropping


def test_a_learned_position_table_bounds_the_buckets_and_the_outputs(tmp_path):
    """A model with 12 learned positions, exported with lengths 8 and 16: the 16 bucket
    becomes 12 (a 16-token source has no encoding; the export crashed on it), and every
    output stops at 12 tokens, as predict.py's do: the ids are predict's. predict.py pads
    an 11-token source to 12, where it padded to 16 and crashed as well."""
    model = Transformer(get_model_config("tiny", vocab_size=40, positional_encoding="learned",
                                         max_length=12))
    ids = jnp.ones((1, 4), jnp.int32)
    params = model.init(jax.random.key(0), ids, ids)["params"]
    trained = TrainedParams(steps=[1], metadata={}, model=model, params=params)
    search = {"beam_size": 2, "alpha": 0.6, "max_extra_length": 50}
    with staged_directory(str(tmp_path / "learned")) as staging:
        entry = export_stablehlo(trained, staging, search=search, batch_sizes=(2,),
                                 lengths=(8, 16))
        with open(os.path.join(staging, MANIFEST_FILE), "w") as f:
            json.dump({"format": "stablehlo", **entry}, f)
    buckets = entry["stablehlo"]["searches"]["beam"]["buckets"]
    assert [(b["length"], b["max_length"]) for b in buckets] == [(8, 12), (12, 12)]
    rng = np.random.default_rng(0)
    sources = [[*rng.integers(4, 40, n).tolist(), 1] for n in (3, 10, 5, 11)]
    served = StableHLOTranslator(tmp_path / "learned")
    for beam_size in (1, 2):
        expected = predict(model, params, sources, beam_size=beam_size, alpha=0.6,
                           max_extra_length=50, batch_size=2)
        got = served.translate_ids(sources, beam_size=beam_size)
        assert max(len(output) for output in expected) == 12
        for want, have in zip(expected, got):
            np.testing.assert_array_equal(have[:len(want)], want)
            assert not have[len(want):].any()  # PAD after


def test_a_damaged_export_is_one_error_naming_the_file(exported, tmp_path):
    """A missing or truncated artifact, parameters that are no .npz and an export.json
    without its entry's keys ended in FileNotFoundError, struct.error, numpy's ValueError or
    a KeyError: each is a StableHLOError naming the file."""
    damaged = tmp_path / "damaged"
    shutil.copytree(exported, damaged)
    translator = StableHLOTranslator(damaged)
    artifact = damaged / translator.searches["greedy"]["buckets"][0]["file"]
    artifact.unlink()
    assert one_line_error(lambda: translator.translate_ids([[5, 1]], beam_size=1)) == (
        f"cannot read {artifact}: No such file or directory; export again")
    artifact.mkdir()  # any error of reading, not only a missing file
    assert one_line_error(lambda: translator.translate_ids([[5, 1]], beam_size=1)) == (
        f"cannot read {artifact}: Is a directory; export again")
    artifact.rmdir()
    artifact.write_bytes((exported / artifact.name).read_bytes()[:1000])
    message = one_line_error(lambda: translator.translate_ids([[5, 1]], beam_size=1))
    assert message.startswith(f"{artifact} is not a jax.export artifact (damaged?): ")
    assert message.endswith("; export again")
    params = (exported / "params.npz").read_bytes()
    for content, why in ((b"not an archive", "ValueError"), (b"", "EOFError"),
                         (params[:1000], "BadZipFile")):  # an interrupted copy
        (damaged / "params.npz").write_bytes(content)
        assert one_line_error(lambda: StableHLOTranslator(damaged)) == (
            f"{damaged / 'params.npz'} is not the parameters the export wrote (damaged?): "
            f"{why}; export again")
    manifest = json.loads((exported / "export.json").read_text())
    del manifest["stablehlo"]["searches"]
    (damaged / "export.json").write_text(json.dumps(manifest))
    assert one_line_error(lambda: StableHLOTranslator(damaged)) == (
        f"{damaged / 'export.json'} lacks stablehlo.searches; export again")
    # Edited by hand, valid JSON: KeyErrors, TypeErrors and max() of nothing, in a search.
    for edit, problem in (
            (lambda e: e.update(searches={}), " must hold a greedy or a beam search, or both"),
            (lambda e: e["searches"]["greedy"].update(buckets=[]),
             ".greedy.buckets must be a list of buckets, each with its batch_size, length, "
             "max_length and file"),
            (lambda e: e["searches"]["greedy"]["buckets"][0].pop("file"),
             ".greedy.buckets must be a list of buckets, each with its batch_size, length, "
             "max_length and file"),
            (lambda e: e["searches"]["greedy"].pop("beam_size"),
             ".greedy must hold its beam_size and max_extra_length")):
        manifest = json.loads((exported / "export.json").read_text())
        edit(manifest["stablehlo"])
        (damaged / "export.json").write_text(json.dumps(manifest))
        assert one_line_error(lambda: StableHLOTranslator(damaged)) == (
            f"{damaged / 'export.json'}: stablehlo.searches{problem}; export again")
    # The folder's files named in its place.
    shutil.copy(exported / "export.json", damaged / "export.json")
    assert one_line_error(lambda: StableHLOTranslator(damaged / "export.json")) == (
        f"{damaged / 'export.json'}: a file, not an exported model's folder (the folder "
        f"holding export.json)")


def test_an_export_json_edited_by_hand_is_one_error(tmp_path):
    """export.json that is no JSON object or no JSON at all, a search of another name, a
    bool for a count, a search or bucket without a key the export writes: each a
    StableHLOError, not a TypeError or KeyError later; "model": null is no vocab_size."""
    greedy = {"beam_size": 1, "max_extra_length": 10, "buckets": [
        {"batch_size": 4, "length": 8, "max_length": 18, "file": "greedy_b4_s8.jaxexport"}]}
    entry = {"params": "params.npz", "platforms": ["cpu"], "searches": {"greedy": greedy}}
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"format": "stablehlo", "stablehlo": entry, "model": None}))
    assert serve_stablehlo._read_entry(str(tmp_path)) == (entry, None, None)
    path.write_text("[]")
    assert one_line_error(lambda: serve_stablehlo._read_entry(str(tmp_path))) == (
        f"{path} holds no export's format; export again")
    path.write_text("{")
    assert one_line_error(lambda: serve_stablehlo._read_entry(str(tmp_path))).startswith(
        f"{path} cannot be read: ")
    buckets = (".greedy.buckets must be a list of buckets, each with its batch_size, length, "
               "max_length and file")
    for searches, problem in (
            ({"sampling": greedy}, " must hold a greedy or a beam search, or both"),
            ({"greedy": {**greedy, "beam_size": True}},
             ".greedy must hold its beam_size and max_extra_length"),
            ({"greedy": {k: v for k, v in greedy.items() if k != "max_extra_length"}},
             ".greedy must hold its beam_size and max_extra_length"),
            ({"greedy": {**greedy, "buckets": [{"batch_size": 4, "length": 8,
                                                "file": "greedy_b4_s8.jaxexport"}]}},
             buckets)):
        assert serve_stablehlo._malformed_searches(searches) == problem


def test_parameters_load_in_the_order_of_their_keys(tmp_path):
    """params.npz's arrays are the leaves in the order of their names (p0000, p0001, ...),
    not of the archive's entries, which another writer may order otherwise."""
    path = tmp_path / "params.npz"
    np.savez(path, p0001=np.ones(2, np.float32), p0000=np.zeros(3, np.float32))
    leaves = serve_stablehlo._load_params(str(path))
    assert [leaf.shape for leaf in leaves] == [(3,), (2,)]
    assert [float(leaf.sum()) for leaf in leaves] == [0.0, 2.0]


def test_a_search_setting_is_a_positive_integer_not_a_bool(exported, translator):
    """beam_size=True had run greedy search and batch_size=True searched one sentence at a
    time, where the Translator refuses a bool; max_input_length=0 had meant no limit. A
    NumPy integer is an integer, as it is to the Translator."""
    served = StableHLOTranslator(exported)
    for name in ("beam_size", "batch_size", "max_input_length"):
        for value in (True, 0, -1, 2.0, "2"):
            assert one_line_error(lambda: served.translate(["null"], **{name: value})) == (
                f"{name} must be a positive integer, got {value!r}")
    beam = translator.search_settings()["beam_size"]
    assert served.translate(["null", "dreihundertzwei"], beam_size=np.int64(1),
                            batch_size=np.int32(1), max_input_length=np.int64(64)) == \
        translator.translate(["null", "dreihundertzwei"], beam_size=1)
    assert f"beam_size {beam + 1} was not exported" in one_line_error(
        lambda: served.translate(["null"], beam_size=np.int64(beam + 1)))


def test_an_export_for_other_platforms_or_without_its_tokenizer_is_one_line(exported,
                                                                          tmp_path):
    """An export lowered for other platforms than this machine's, and one whose tokenizer
    is gone: each a StableHLOError saying what to do; ids still translate without the
    tokenizer, which only text needs."""
    other = tmp_path / "other"
    shutil.copytree(exported, other)
    manifest = json.loads((exported / "export.json").read_text())
    manifest["stablehlo"]["platforms"] = ["tpu"]
    (other / "export.json").write_text(json.dumps(manifest))
    here = jax.export.default_export_platform()
    assert one_line_error(lambda: StableHLOTranslator(other)) == (
        f"{other} was exported for tpu, but jax runs on {here} here; export it again on "
        f"this machine")
    shutil.copy(exported / "export.json", other / "export.json")
    (other / "tokenizer.model").unlink()
    served = StableHLOTranslator(other)
    assert one_line_error(lambda: served.translate(["null"])) == (
        f"{other} has no tokenizer.model")
    assert len(served.translate_ids([[5, 1]], beam_size=1)) == 1


def test_sources_that_are_no_ids_of_the_model_are_refused(exported):
    """Ids outside the vocabulary, negative ones, floats and an empty source had searched
    into nonsense (an empty one into a full-length output)."""
    translator = StableHLOTranslator(exported)
    vocab_size = json.loads((exported / "export.json").read_text())["model"]["vocab_size"]
    for sources, message in (
            ([[5, 1], [vocab_size, 1]], f"source 2 holds ids outside the model's vocabulary "
                                        f"[0, {vocab_size}): 1 to {vocab_size}"),
            ([[-5, 1]], f"source 1 holds ids outside the model's vocabulary [0, {vocab_size}): "
                        f"-5 to 1"),
            ([[1.5, 1]], "source 1 is not a list of token ids ending with EOS (1): [1.5, 1.0]"),
            ([[]], "source 1 is not a list of token ids ending with EOS (1): []")):
        assert one_line_error(lambda: translator.translate_ids(sources, beam_size=1)) == message
    # An export.json that does not say vocab_size: negative ids alone are refused.
    with pytest.raises(StableHLOError, match=r"^source 1 holds ids below 0, which no "
                       r"vocabulary holds: -5 to 1$"):
        serve_stablehlo._check_ids([[-5, 1]], None)
    serve_stablehlo._check_ids([[10**6, 1]], None)  # no upper bound to pass
    serve_stablehlo._check_ids([np.array([5, 1], np.uint16)], 10)  # prepared splits' dtype
    with pytest.raises(StableHLOError, match=r"^source 1 is not a list of token ids ending "
                       r"with EOS \(1\): \[\[5, 1\]\]$"):
        serve_stablehlo._check_ids([[[5, 1]]], 10)  # a batch where a source belongs
    ids = translator.translate_ids([np.array([5, 1], np.int64), [vocab_size - 1, 1]],
                                   beam_size=1)  # NumPy's ids, and the last id, are ids
    assert len(ids) == 2


def test_parameters_or_a_tokenizer_of_another_model_are_refused(exported, tmp_path):
    """A params.npz of another shape reached jax's "Shape mismatch for args[0][0]", and
    another tokenizer.model translated into nonsense without a word."""
    damaged = tmp_path / "damaged"
    shutil.copytree(exported, damaged)
    with np.load(exported / "params.npz") as npz:
        leaves = {key: npz[key] for key in npz.files}
    first = sorted(leaves)[0]
    np.savez(damaged / "params.npz", **{**leaves, first: leaves[first][:1]})
    want = list(leaves[first].shape)
    assert one_line_error(lambda: StableHLOTranslator(damaged).translate_ids([[5, 1]])) == (
        f"{damaged / 'params.npz'} does not fit the exported model: its array 0 is "
        f"float32{[1, *want[1:]]}, the model takes float32{want}; export again")
    np.savez(damaged / "params.npz", **{**leaves, first: leaves[first].astype(np.float16)})
    assert one_line_error(lambda: StableHLOTranslator(damaged).translate_ids([[5, 1]])) == (
        f"{damaged / 'params.npz'} does not fit the exported model: its array 0 is "
        f"float16{want}, the model takes float32{want}; export again")
    np.savez(damaged / "params.npz", **{k: v for k, v in leaves.items() if k != first})
    assert one_line_error(lambda: StableHLOTranslator(damaged).translate_ids([[5, 1]])) == (
        f"{damaged / 'params.npz'} holds {len(leaves) - 1} parameter arrays, the exported "
        f"model takes {len(leaves)}; export again")
    shutil.copy(exported / "params.npz", damaged / "params.npz")
    tokenizer = damaged / "tokenizer.model"
    tokenizer.write_bytes(tokenizer.read_bytes() + b"\n")  # another file, still a model?
    assert one_line_error(lambda: StableHLOTranslator(damaged).translate(["null"])) == (
        f"{tokenizer} is not the tokenizer this model was exported with (its SHA-256 "
        f"differs from export.json's); export again")
    manifest = json.loads((damaged / "export.json").read_text())
    del manifest["tokenizer_sha256"]  # as in an earlier export: only parsing is checked
    (damaged / "export.json").write_text(json.dumps(manifest))
    tokenizer.write_bytes(b"junk")
    assert one_line_error(lambda: StableHLOTranslator(damaged).translate(["null"])) == (
        f"{tokenizer} is damaged (not a SentencePiece model); export again")
