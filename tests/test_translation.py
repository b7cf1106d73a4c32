"""translate.py and evaluate.py on a tiny trained run; checkpoint averaging; parameters
restored without the optimizer; BLEU while training."""

import dataclasses
import errno
import hashlib
import importlib.util
import json
import os
import pty
import re
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from run_configs import BAD_SEARCH_SETTINGS, ROOT, array_files, shared_run, tiny_run
from transformer_jax.bleu import score
from transformer_jax.checkpoint import Checkpointer
from transformer_jax.data import load_split
from transformer_jax.data.vocabulary import tokenizer_path
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig
from transformer_jax.optim import optimizer_from_config
from transformer_jax.trainer import train
from transformer_jax.attention import attention_weights
from transformer_jax.token_ids import PAD_ID
from transformer_jax.train_state import abstract_train_state, init_params
from transformer_jax.compilation_cache import drop_damaged_entries
from transformer_jax.commands import (OutputError, interrupt_in_one_line, write_stdout,
                                      write_stdout_and_go_on, write_whole)
from transformer_jax.translation import (TranslationError, Translator, check_setting,
                                         cross_attention_weights)

SENTENCES = ["dreihundertzweiundvierzig", "einundzwanzigtausendfünf", "null"]


@pytest.fixture
def workdir(trained_run):
    """The shared run (conftest.py): 4 steps of the tiny run, checkpoints at steps 2 and 4.
    Only read: a test that writes in a workdir takes `workdir_copy`."""
    return trained_run.workdir


@pytest.fixture
def workdir_copy(workdir, tmp_path):
    """A copy of the shared run, tmp_path/run, for one test to change."""
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    return copy


def run(script, *args, stdin=None, max_file_size=None, env=None):
    """`script` run with `args` (and `env` added to the environment); files it writes end
    at `max_file_size` bytes (a full disk: writes fail with EFBIG, "File too large"; Python
    ignores SIGXFSZ)."""
    limit = [] if max_file_size is None else [sys.executable, "-c", LIMIT_FILES,
                                              str(max_file_size)]
    return subprocess.run([*limit, sys.executable, script, *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=300,
                          env=None if env is None else {**os.environ, **env})


# Sets RLIMIT_FSIZE and runs the command (no preexec_fn: this process has threads).
LIMIT_FILES = ("import os, resource, sys; size = int(sys.argv[1]); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (size, size)); "
               "os.execv(sys.argv[2], sys.argv[2:])")


def test_translate_stdin_and_files_agree_with_the_library(workdir, tmp_path):
    expected = Translator.from_workdir(str(workdir)).translate(SENTENCES)
    by_pipe = run("translate.py", f"--workdir={workdir}", stdin="\n".join(SENTENCES) + "\n")
    assert by_pipe.returncode == 0, by_pipe.stderr
    assert by_pipe.stdout.splitlines() == expected
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    by_file = run("translate.py", f"--workdir={workdir}", f"--input={tmp_path / 'in.txt'}",
                  f"--output={tmp_path / 'out.txt'}", "--beam_size=1")
    assert by_file.returncode == 0, by_file.stderr
    greedy = Translator.from_workdir(str(workdir)).translate(SENTENCES, beam_size=1)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == greedy


def test_translate_and_evaluate_load_the_searches_an_earlier_command_compiled(workdir_copy):
    """translate.py saves the searches it compiles in WORKDIR/compilation_cache (every one
    here: no minimum compile time); a second translate.py loads them and writes the same
    translations; evaluate.py saves its own searches there too."""
    shutil.rmtree(workdir_copy / "compilation_cache", ignore_errors=True)
    env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_LOG_COMPILES": "1"}  # JAX then logs each program loaded from the cache
    hit = "Persistent compilation cache hit for 'jit_predict_step'"

    def translate():
        done = subprocess.run([sys.executable, "translate.py", f"--workdir={workdir_copy}"],
                              cwd=ROOT, input="\n".join(SENTENCES) + "\n", env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done

    first = translate()
    assert hit not in first.stderr
    assert list((workdir_copy / "compilation_cache").glob("jit_predict_step-*"))
    second = translate()
    assert hit in second.stderr and second.stdout == first.stdout
    saved = set((workdir_copy / "compilation_cache").glob("jit_predict_step-*"))
    evaluated = subprocess.run([sys.executable, "evaluate.py", f"--workdir={workdir_copy}",
                                "--split=test"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    # The test split's batches have other shapes than the 3 sentences': saved beside them.
    assert set((workdir_copy / "compilation_cache").glob("jit_predict_step-*")) > saved


def test_translate_on_a_terminal_answers_each_line_as_it_is_entered(translating_run,
                                                                    tmp_path):
    """stdin a terminal (a pseudo-terminal here): each translation is on stdout before the
    next line is typed, and equals the library's; a line that is not UTF-8 or too long is
    one error line naming it, and the next is still read; Ctrl-D after text ends that line,
    a second ends the input (status 0); with --output the translations are written there
    too, whole, at the end."""
    workdir = translating_run.workdir  # it translates: outputs differ from sentence to sentence
    translator = Translator.from_workdir(str(workdir))
    sentences = SENTENCES[:3]
    expected = [translator.translate([sentence])[0] + "\n" for sentence in sentences]
    terminal, stdin = pty.openpty()
    process = subprocess.Popen([sys.executable, "translate.py", f"--workdir={workdir}",
                                "--max_input_length=12", f"--output={tmp_path / 'out.txt'}"],
                               cwd=ROOT, stdin=stdin, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    os.close(stdin)
    try:
        # Line 1; lines 2 and 3 refused; line 4; line 5, ended by Ctrl-D.
        for before, sentence, end, translation in (
                ([], sentences[0], b"\n", expected[0]),
                ([b"zw\xffei\n", ("null " * 20 + "\n").encode()], sentences[1], b"\n",
                 expected[1]),
                ([], sentences[2], b"\x04", expected[2])):
            for line in before:
                os.write(terminal, line)
            os.write(terminal, sentence.encode() + end)
            assert _line_within(process.stdout, 120) == translation.encode()
        os.write(terminal, b"\x04")  # at the start of a line: the end of the input
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(terminal)
    assert process.returncode == 0 and out == b"", err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "".join(expected)
    tokens = len(translator.tokenizer.encode("null " * 20, add_eos=True))
    assert err.decode().splitlines()[-3:] == [
        "translating each line as it is entered; Ctrl-D ends",
        "error: stdin, line 2: not valid UTF-8 (invalid start byte at byte 3 of the line)",
        f"error: stdin, line 3: the sentence has {tokens} tokens, more than "
        "max_input_length=12; split it or raise the limit (--max_input_length)"]


def _line_within(stream, seconds: float) -> bytes:
    """The next line of `stream`, read byte by byte; what came if none ends in `seconds`."""
    line, deadline = b"", time.monotonic() + seconds
    while not line.endswith(b"\n") and select.select([stream], [], [], max(
            0.0, deadline - time.monotonic()))[0]:
        byte = os.read(stream.fileno(), 1)
        if not byte:
            break
        line += byte
    return line


def test_translate_helpshort_lists_every_flag():
    """--helpshort lists translate.py's flags, those command_line.py defines for it too,
    each with the values it takes (absl's exit status for --helpshort is 1)."""
    result = run("translate.py", "--helpshort")
    assert result.returncode == 1 and not result.stderr, result.stderr
    listed = set(re.findall(r"^  --(\w+)", result.stdout, re.MULTILINE))
    assert listed == {"workdir", "engine", "exported", "input", "output", "beam_size", "alpha",
                      "max_extra_length", "checkpoint", "batch_size", "max_input_length"}
    assert "--batch_size: sentences per search\n    (default: '32')\n    (a positive " \
           "integer)" in result.stdout


def test_translate_errors_are_one_line(workdir, tmp_path):
    for args, message in (([f"--workdir={tmp_path}"], "has no checkpoints"),
                          ([f"--workdir={workdir}", "--checkpoint=average:5"],
                           "average:5 needs 5 checkpoints; there are 2"),
                          ([f"--workdir={workdir}", "--checkpoint=3"], "use latest, a step (2, 4)"),
                          # the files are checked before the run is read (and JAX loads)
                          ([f"--workdir={tmp_path}", f"--input={tmp_path / 'missing.txt'}"],
                           "missing.txt"),
                          ([f"--workdir={workdir}", "--checkpoint=average:x"],
                           "average:N needs a number of checkpoints N"),
                          ([f"--workdir={tmp_path}", f"--output={tmp_path}"],
                           f"error: --output={tmp_path} is a folder; give a file name"),
                          # Translator's words (search flags, and one of translate.py's own)
                          ([f"--workdir={workdir}", "--beam_size=0"],
                           "flag --" + refusal("beam_size", 0)),
                          ([f"--workdir={workdir}", "--batch_size=0"],
                           "flag --" + refusal("batch_size", 0)),
                          ([f"--workdir={workdir}", "--alpha=nan"],
                           "flag --" + refusal("alpha", float("nan")))):
        result = run("translate.py", *args, stdin="")
        assert result.returncode == 1 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    too_long = run("translate.py", f"--workdir={workdir}", "--max_input_length=12",
                   stdin=("null\n" + "dreihundertzweiundvierzigtausendeinhundertelf " * 4
                          + "\nnull\n"))
    assert too_long.returncode == 1 and "Traceback" not in too_long.stderr
    assert too_long.stderr.strip().splitlines()[-1].startswith("error: sentence 2 has ")
    assert "more than max_input_length=12 (1 sentence(s) too long)" in too_long.stderr
    bad_utf8 = subprocess.run([sys.executable, "translate.py", f"--workdir={workdir}"], cwd=ROOT,
                              input=b"drei\nzw\xffei\n", capture_output=True, timeout=300)
    assert bad_utf8.returncode == 1 and b"Traceback" not in bad_utf8.stderr
    assert bad_utf8.stderr.decode().strip() == ("error: stdin, line 2: not valid UTF-8 "
                                                "(invalid start byte at byte 3 of the line)")
    # A stdin that cannot be read (here open for writing only: EBADF; a terminal gone: EIO)
    # is named.
    with open(tmp_path / "write-only", "wb") as write_only:
        unreadable = subprocess.run([sys.executable, "translate.py", f"--workdir={workdir}"],
                                    cwd=ROOT, stdin=write_only, capture_output=True, text=True,
                                    timeout=300)
    assert unreadable.returncode == 1
    assert unreadable.stderr.strip() == "error: cannot read stdin: Bad file descriptor"


def test_a_setting_of_no_number_type_is_a_type_error_naming_what_it_must_be():
    """Translator's search settings take what the flags take; absl's own words for another
    type ("Expect argument to be a string or int") are the command line's, not Python's."""
    for (name, value), expected in (
            (("beam_size", 2.5), "beam_size=2.5: must be a positive integer, not a float"),
            (("max_extra_length", True),
             "max_extra_length=True: must be a non-negative integer, not a bool"),
            (("alpha", [0.6]), "alpha=[0.6]: must be a non-negative number, not a list")):
        with pytest.raises(TypeError) as error:
            check_setting(name, value)
        assert str(error.value) == expected
    assert check_setting("beam_size", np.int64(3)) == 3 and check_setting("alpha", 1) == 1.0
    # JAX's concrete scalars count as their number too; one of no integer, by its number's type.
    assert check_setting("beam_size", jnp.int32(3)) == 3
    assert check_setting("alpha", jnp.float32(0.5)) == 0.5
    for value, kind in ((jnp.float32(2.5), "float"), (jnp.bool_(True), "bool")):
        with pytest.raises(TypeError) as error:
            check_setting("beam_size", value)
        assert str(error.value) == f"beam_size={value!r}: must be a positive integer, not a {kind}"


def refusal(name: str, value) -> str:
    """The ValueError's message for setting `name` = `value` in Translator, e.g.
    "beam_size=0: 0 is not a positive integer"."""
    with pytest.raises(ValueError) as error:
        check_setting(name, value)
    return str(error.value)


def test_translator_refuses_bad_input_as_translate_py_does(workdir, monkeypatch):
    """A setting translate.py's flag refuses is a ValueError in its words (the CLI's own
    words are compared in test_translate_errors_are_one_line); one str instead of a list
    of sentences, or lists given to attention_maps, a TypeError; all before any search."""
    from transformer_jax import predict

    monkeypatch.setattr(predict, "_predict_step", lambda *a, **k: pytest.fail("searched"))
    translator = Translator.from_workdir(str(workdir))
    for setting, message in BAD_SEARCH_SETTINGS:
        with pytest.raises(ValueError) as error:
            translator.translate(["zwei"], **setting)
        assert str(error.value) == message
    with pytest.raises(ValueError, match="^beam_size=0: 0 is not a positive integer$"):
        translator.search_settings(beam_size=0)
    with pytest.raises(TypeError) as one_str:
        translator.translate("zwei")
    assert str(one_str.value) == ("translate takes a list of sentences, not one str: "
                                  "pass [sentence]")
    with pytest.raises(TypeError, match="^sentence 2 is a NoneType, not a str$"):
        translator.translate(["zwei", None])
    with pytest.raises(TypeError) as lists:
        translator.attention_maps(["zwei"], ["two"])
    assert str(lists.value) == ("attention_maps takes a source and a target sentence, each "
                                "a str, not list and list")
    for source, target, blank in (("", "two", "the source is"), ("zwei", " ", "the target is"),
                                  (" ", "", "the source and the target are")):
        with pytest.raises(ValueError) as error:
            translator.attention_maps(source, target)
        assert str(error.value) == ("attention_maps needs words in the source and the target; "
                                    f"{blank} blank")
    # Settings of the right kind pass as they are, and the run's fill in for None.
    decode = tiny_run().decode
    assert translator.search_settings(beam_size=2, alpha=0, max_extra_length=None) == {
        "beam_size": 2, "alpha": 0.0, "max_extra_length": decode.max_extra_length}


def test_an_empty_line_translates_to_an_empty_line_unsearched(translating_run, monkeypatch):
    """A sentence whose tokenization is empty, or of whitespace alone (which training never
    saw: it skips such pairs), is "", never searched (whatever a search would invent for
    it); its neighbours keep their order and their translations."""
    from transformer_jax import predict

    translator = Translator.from_workdir(str(translating_run.workdir))
    ids = translator.tokenizer.encode_batch(SENTENCES[:2], add_eos=True)
    alone = translator.translate(SENTENCES[:2], beam_size=1)
    assert all(alone)
    searched, search = [], predict._predict_step
    monkeypatch.setattr(predict, "_predict_step", lambda params, inputs_BS, **kw: (
        searched.extend(inputs_BS.tolist()), search(params, inputs_BS, **kw))[1])
    assert translator.translate([SENTENCES[0], "", SENTENCES[1], " \t "], beam_size=1) == [
        alone[0], "", alone[1], ""]
    # One batch of 2 rows: the two sentences (sorted by length, padded), not the empty one.
    assert [[i for i in row if i != PAD_ID] for row in searched] == sorted(ids, key=len)
    assert translator.translate(["", ""], beam_size=1) == ["", ""]
    assert len(searched) == 2


def test_every_engine_translates_an_empty_line_to_an_empty_line(translating_run, tmp_path,
                                                               monkeypatch):
    """translate.py's other engines give the lines the run gives, "" for the empty one: its
    CTranslate2 export, and the stablehlo engine's text path (here over a stand-in for the
    exported searches that runs the run's own and records its sources;
    test_export_stablehlo.py compares the real ones with the run's)."""
    from transformer_jax.export import engines, serve_stablehlo
    from transformer_jax.predict import predict

    workdir = str(translating_run.workdir)
    lines = [SENTENCES[0], "", SENTENCES[2], "  "]
    translator = Translator.from_workdir(workdir)
    expected = translator.translate(lines, beam_size=1)  # the jax engine's
    assert expected[1] == expected[3] == "" and expected[0] and expected[2]
    searched = []

    class ExportedSearches(serve_stablehlo.StableHLOTranslator):
        """Its text path; translate_ids on the run's parameters."""

        def __init__(self, directory):
            self.directory, self._tokenizer, self._tokenizer_sha256 = directory, None, None
            self._entry = {"searches": {"greedy": {"beam_size": 1,
                                                   "buckets": [{"length": 1024}]}}}

        def translate_ids(self, rows, *, beam_size, batch_size, progress):
            searched.extend(rows)
            return predict(translator.model, translator.params, rows, batch_size=batch_size,
                           **translator.search_settings(beam_size=beam_size))

    monkeypatch.setattr(serve_stablehlo, "StableHLOTranslator", ExportedSearches)
    shutil.copy(tokenizer_path(workdir), tmp_path / "tokenizer.model")
    stablehlo = engines._stablehlo(str(tmp_path), translator.search_settings())
    assert stablehlo(lines, beam_size=1, batch_size=32) == expected
    assert searched == translator.tokenizer.encode_batch(lines[0:3:2], add_eos=True)
    if importlib.util.find_spec("ctranslate2"):  # an optional dependency ('.[serve]')
        from transformer_jax.export import export

        export(workdir, str(tmp_path / "ct2"), fmt="ctranslate2")
        ct2 = engines.open_engine("ctranslate2", exported=str(tmp_path / "ct2"))
        assert ct2.translate(lines, beam_size=1) == expected


@pytest.mark.parametrize("name, folders, message", [
    ("jax", {}, "translating needs --workdir=DIR (a training run's folder), or "
                "--engine=ctranslate2 or stablehlo with --exported=DIR"),
    ("jax", {"workdir": ""}, "--workdir is empty (an unset shell variable?); name a training "
                             "run's folder"),
    ("stablehlo", {"exported": " "}, "--exported is empty (an unset shell variable?); name "
                                     "the folder of an export"),
    ("ctranslate2", {}, "--engine=ctranslate2 translates with --exported=DIR (the folder of "
                        "an export)"),
    ("jax", {"workdir": "W", "exported": "E"}, "--engine=jax translates with --workdir=DIR, "
                                               "not --exported")])
def test_an_engine_without_its_folder_says_which_it_needs(name, folders, message):
    """translate.py with no --workdir, or --workdir=$RUN with RUN unset, named the flag
    --engine=jax, which the user never typed, and did not say the folder was empty."""
    from transformer_jax.export.engines import open_engine
    from transformer_jax.translation import TranslationError

    with pytest.raises(TranslationError) as caught:
        open_engine(name, **folders)
    assert str(caught.value) == message


def test_translate_keeps_output_lines_aligned_with_input_lines(workdir):
    """Lines end at "\\n" only (\\r\\n too); a BOM is not part of the first sentence."""
    lines = ["einundzwanzig", "zwei\x85drei", "vier\u2028fünf\x0bsechs\x1c"]
    text = "\ufeff" + lines[0] + "\r\n" + "\n".join(lines[1:]) + "\n"
    result = run("translate.py", f"--workdir={workdir}", "--beam_size=1", stdin=text)
    assert result.returncode == 0, result.stderr
    expected = Translator.from_workdir(str(workdir)).translate(lines, beam_size=1)
    assert result.stdout.split("\n") == expected + [""]


def test_searches_have_no_more_rows_than_sentences(workdir, monkeypatch):
    """3 sentences in batches of 32 search 4 rows (3 rounded up to a power of two), in
    batches of 2: 2 rows, then 1; the translations do not depend on the batching."""
    from transformer_jax import predict

    shapes, search = [], predict._predict_step
    monkeypatch.setattr(predict, "_predict_step", lambda params, inputs_BS, **kw: (
        shapes.append(inputs_BS.shape[0]), search(params, inputs_BS, **kw))[1])
    translator = Translator.from_workdir(str(workdir))
    together = translator.translate(SENTENCES, beam_size=2)
    assert shapes == [4]
    assert translator.translate(SENTENCES, beam_size=2, batch_size=2) == together
    assert shapes == [4, 2, 1]
    with pytest.raises(TranslationError, match="sentence 1 has .* tokens, more than "
                                               "max_input_length=2"):
        translator.translate(SENTENCES, max_input_length=2)
    assert shapes == [4, 2, 1]  # refused before any search


def test_average_of_the_last_two_checkpoints(workdir):
    latest = Translator.from_workdir(str(workdir), "latest")
    earlier = Translator.from_workdir(str(workdir), "2")
    averaged = Translator.from_workdir(str(workdir), "average:2")
    assert averaged.steps == [2, 4] and latest.steps == [4]
    jax.tree.map(lambda a, x, y: np.testing.assert_allclose(a, (x + y) / 2, rtol=1e-6, atol=1e-7),
                 averaged.params, latest.params, earlier.params)
    # A notebook cell showing the translator shows what it is, not its parameters' arrays.
    shown = repr(averaged)
    assert len(shown) < 1_000 and "Array(" not in shown and "steps=[2, 4]" in shown
    assert (f"Tokenizer(vocab_size={averaged.tokenizer.vocab_size}, "
            f"sha256={averaged.tokenizer.sha256[:12]}...)") in shown
    assert f"d_model={averaged.model.config.d_model}," in shown


def test_attention_maps_are_the_weights_of_the_layers_own_queries_and_keys(workdir):
    """Pieces and shapes match the tokens; each map is softmax(q kᵀ/√H) of the projections."""
    translator = Translator.from_workdir(str(workdir))
    tokenizer, config = translator.tokenizer, translator.model.config
    maps = translator.attention_maps(SENTENCES[0], "three hundred and forty-two")
    source_ids = tokenizer.encode(SENTENCES[0], add_eos=True)
    target_ids = tokenizer.encode("three hundred and forty-two", add_eos=True)
    assert maps["source"] == [tokenizer.id_to_piece(i) for i in source_ids]
    assert maps["target"] == [tokenizer.id_to_piece(i) for i in target_ids]
    assert maps["source"][-1] == maps["target"][-1] == "</s>"
    weights_LNTS = maps["cross_attention"]
    assert weights_LNTS.shape == (config.num_layers, config.num_heads, len(target_ids),
                                  len(source_ids))
    np.testing.assert_allclose(weights_LNTS.sum(-1), 1.0, rtol=1e-5)
    # By hand: Flax captures each module's output, here the encoder's memory and, in each
    # decoder layer, the state entering the cross-attention (post-LN: the self-attention
    # sublayer's norm); project them with the layer's own parameters.
    assert not config.pre_layer_norm
    inputs_BS, targets_BT = np.array([source_ids]), np.array([target_ids])
    _, state = translator.model.apply({"params": translator.params}, inputs_BS, targets_BT,
                                      capture_intermediates=True)
    captured = state["intermediates"]
    memory_BSD = captured["encoder"]["__call__"][0]
    params = jax.device_get(translator.params)  # on the device: NumPy arrays for NumPy's einsum
    for i in range(config.num_layers):
        y_BTD = captured["decoder"][f"layer_{i}"]["self_attention_norm"]["__call__"][0]
        query, key = (params["decoder"][f"layer_{i}"]["cross_attention"][name]
                      for name in ("query", "key"))
        q_BTNH = np.einsum("BTD,DNH->BTNH", y_BTD, query["kernel"]) + query["bias"]
        k_BSNH = np.einsum("BSD,DNH->BSNH", memory_BSD, key["kernel"]) + key["bias"]
        expected_BNTS = attention_weights(q_BTNH, k_BSNH)
        np.testing.assert_allclose(weights_LNTS[i], expected_BNTS[0], rtol=1e-5, atol=1e-6)
    # A padded batch: padding keys get 0 and the real keys the same weights as unpadded.
    padded_BS = np.pad(inputs_BS, ((0, 0), (0, 3)))
    padded_LBNTS = cross_attention_weights(translator.model, translator.params, padded_BS,
                                           targets_BT)
    assert np.all(np.asarray(padded_LBNTS)[..., len(source_ids):] == 0)
    np.testing.assert_allclose(padded_LBNTS[:, 0, ..., :len(source_ids)], weights_LNTS,
                               rtol=1e-5, atol=1e-6)


def test_evaluate_writes_hypotheses_references_and_scores(workdir_copy):
    """The hypotheses and the references they were scored against, line by line; the scores
    and both signatures; a beam size other than the run's in the results' name."""
    result = run("evaluate.py", f"--workdir={workdir_copy}", "--split=validation",
                 "--beam_size=2", "--batch_size=3")
    assert result.returncode == 0, result.stderr
    stem = workdir_copy / "eval" / "validation-4-beam2"
    assert result.stdout.splitlines()[-1] == f"wrote {stem}.hyp.txt, .ref.txt and .json"
    record = json.loads(stem.with_suffix(".json").read_text())
    hypotheses = stem.with_suffix(".hyp.txt").read_text(encoding="utf-8").splitlines()
    references = [p["target"] for p in load_split(tiny_run().data, "validation").pairs]
    chrf = sacrebleu.CHRF()
    chrf.corpus_score(hypotheses, [references])  # its signature needs a score first
    chrf_signature = str(chrf.get_signature())
    assert f"chrF {chrf_signature}\n" in result.stdout and "|nc:6|nw:0|" in chrf_signature
    assert "sacreBLEU signatures: BLEU nrefs:1|case:mixed" in result.stdout
    assert stem.with_suffix(".ref.txt").read_text(encoding="utf-8").splitlines() == references
    assert len(hypotheses) == record["sentences"] and record["skipped_empty"] == 0
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert record["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert record["chrf_signature"] == chrf_signature
    assert record["beam_size"] == 2 and record["direction"] == "de-en" and record["step"] == 4
    assert record["batch_size"] == 3
    assert record["sentences_per_sec"] > 0


def test_evaluate_names_the_averaged_checkpoints(workdir_copy):
    """--checkpoint=average:2 averages steps 2 and 4, says so, and files the result under its
    own name, not as step 4's; the deprecated --average_last cannot be given beside
    --checkpoint, even beside --checkpoint=latest."""
    result = run("evaluate.py", f"--workdir={workdir_copy}", "--split=validation",
                 "--checkpoint=average:2", "--beam_size=1", "--alpha=0.5",
                 "--max_extra_length=7")
    assert result.returncode == 0, result.stderr
    assert "sentences, the average of checkpoints 2, 4): BLEU" in result.stdout
    stem = workdir_copy / "eval" / "validation-4-average2-beam1-alpha0.5-extra7"
    record = json.loads(Path(f"{stem}.json").read_text())
    assert record["checkpoints"] == [2, 4] and record["beam_size"] == 1
    assert record["alpha"] == 0.5 and record["max_extra_length"] == 7
    assert Path(f"{stem}.hyp.txt").exists()
    for given in ("--checkpoint=2", "--checkpoint=latest"):
        both = run("evaluate.py", f"--workdir={workdir_copy}", given, "--average_last=2")
        assert both.returncode == 1
        assert both.stderr.strip() == ("error: give --checkpoint or the deprecated "
                                       "--average_last, not both")


def with_folder_test_split(workdir, corpus, pairs) -> None:
    """`workdir`'s checkpoints pointed at `corpus` (a `folder:` dataset) whose test split is
    `pairs` (German, English); its other splits hold one pair each."""
    corpus.mkdir()
    for split, chosen in (("train", [("eins", "one")]), ("validation", [("zwei", "two")]),
                          ("test", pairs)):
        for side, lang in ((0, "de"), (1, "en")):
            (corpus / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in chosen),
                                                    encoding="utf-8")
    with_dataset(workdir, f"folder:{corpus}")


def with_dataset(workdir, dataset: str) -> None:
    """`workdir`'s checkpoints recording `dataset` as their config.data.dataset."""
    for path in (workdir / "checkpoints").glob("*/metadata/metadata"):
        metadata = json.loads(path.read_text())
        metadata["config"]["data"]["dataset"] = dataset
        path.write_text(json.dumps(metadata))


def test_evaluate_skips_pairs_with_an_empty_side_and_says_how_many(workdir_copy, tmp_path):
    """Blank pairs are not scored: their number is printed and recorded, and the references
    written beside the hypotheses are the pairs scored, so the two files line up. A split
    with nothing to score is one line, and no results folder is made."""
    pairs = [("dreihundert", "three hundred"), ("", "lost"), ("zwei", "two"),
             ("vier", "  "), ("zwei", "two")]
    with_folder_test_split(workdir_copy, tmp_path / "corpus", pairs)
    result = run("evaluate.py", f"--workdir={workdir_copy}", "--beam_size=1")
    assert result.returncode == 0, result.stderr
    assert "de-en test (3 sentences; 2 with an empty side skipped, checkpoint 4): BLEU" \
        in result.stdout
    stem = workdir_copy / "eval" / "test-4-beam1"
    references = stem.with_suffix(".ref.txt").read_text(encoding="utf-8").splitlines()
    hypotheses = stem.with_suffix(".hyp.txt").read_text(encoding="utf-8").splitlines()
    assert references == ["three hundred", "two", "two"] and len(hypotheses) == 3
    record = json.loads(stem.with_suffix(".json").read_text())
    assert record["sentences"] == 3 and record["skipped_empty"] == 2
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)

    empty = tmp_path / "empty_run"
    shutil.copytree(workdir_copy, empty, ignore=shutil.ignore_patterns("eval"))
    with_folder_test_split(empty, tmp_path / "blank_corpus", [("", "one"), (" ", " ")])
    nothing = run("evaluate.py", f"--workdir={empty}")
    assert nothing.returncode == 1
    assert nothing.stderr.strip() == ("error: the test split has no pairs with text on both "
                                      "sides (2 with an empty side)")
    assert not (empty / "eval").exists()
    # A run that recorded its corpus by a relative path (before runs recorded absolute ones):
    # from another folder it is not found, and the error says why, and evaluate.py's flag
    # for its new place (not train.py's --config.data.dataset).
    with_dataset(empty, "folder:blank_corpus")
    gone = run("evaluate.py", f"--workdir={empty}")
    assert gone.returncode == 1
    assert gone.stderr.strip() == (
        f"error: the run's corpus folder 'blank_corpus' (relative to the folder train.py ran "
        f"in, not to {ROOT}) does not exist; evaluate.py reads the test split there (the "
        f"run's config.data.dataset): put the corpus there again or a link to it, or give "
        f"its new place as --dataset=folder:PATH")


def test_evaluate_reads_the_split_of_the_dataset_given(workdir_copy, tmp_path):
    """--dataset: the test split of another folder in the run's languages, scored, recorded
    and filed under a name of its own (the run's results are not replaced); the run's own
    folder written another way files under the run's name. A --dataset of no known form, or
    a folder that is not there, is one line before the model loads."""
    with_folder_test_split(workdir_copy, tmp_path / "corpus", [("zwei", "two")])
    other = tmp_path / "newstest"
    pairs = [("dreihundert", "three hundred"), ("zwei", "two"), ("vierzig", "forty")]
    other.mkdir()
    for side, lang in ((0, "de"), (1, "en")):
        (other / f"test.{lang}").write_text("".join(p[side] + "\n" for p in pairs),
                                            encoding="utf-8")
    result = run("evaluate.py", f"--workdir={workdir_copy}", f"--dataset=folder:{other}",
                 "--beam_size=1")
    assert result.returncode == 0, result.stderr
    assert f"de-en test of folder:{other} (3 sentences, checkpoint 4): BLEU" in result.stdout
    digits = hashlib.sha256(os.path.realpath(other).encode()).hexdigest()[:6]
    stem = workdir_copy / "eval" / f"test-4-beam1-on-newstest-{digits}"
    references = stem.with_suffix(".ref.txt").read_text(encoding="utf-8").splitlines()
    hypotheses = stem.with_suffix(".hyp.txt").read_text(encoding="utf-8").splitlines()
    assert references == ["three hundred", "two", "forty"] and len(hypotheses) == 3
    record = json.loads(stem.with_suffix(".json").read_text())
    assert record["dataset"] == f"folder:{other}" and record["sentences"] == 3
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert sorted(path.name for path in (workdir_copy / "eval").iterdir()) == [
        f"{stem.name}.{kind}" for kind in ("hyp.txt", "json", "ref.txt")]
    own = run("evaluate.py", f"--workdir={workdir_copy}", f"--dataset=folder:{tmp_path}/corpus/",
              "--beam_size=1")
    assert own.returncode == 0, own.stderr
    record = json.loads((workdir_copy / "eval" / "test-4-beam1.json").read_text())
    assert record["dataset"] == f"folder:{tmp_path / 'corpus'}" and record["sentences"] == 1
    for given, error in (("books", "--dataset: unknown dataset 'books'; use \"numbers\", "
                                    "\"tfds:NAME\" (e.g. tfds:wmt14_translate/de-en) or "
                                    "\"folder:PATH\""),
                         (f"folder:{tmp_path}/gone", f"--dataset: no folder {tmp_path}/gone")):
        wrong = run("evaluate.py", f"--workdir={workdir_copy}", f"--dataset={given}")
        assert (wrong.returncode, wrong.stderr.strip()) == (1, f"error: {error}")


def test_search_settings_default_to_the_runs_decode_group(workdir):
    """§6.1's settings live in config.decode: the CLIs and Translator take them from the run."""
    translator = Translator.from_workdir(str(workdir))
    decode = tiny_run().decode
    assert translator.search_settings() == {"beam_size": decode.beam_size,
                                            "alpha": decode.alpha,
                                            "max_extra_length": decode.max_extra_length}
    assert translator.search_settings(beam_size=1, alpha=None) == {
        "beam_size": 1, "alpha": decode.alpha, "max_extra_length": decode.max_extra_length}
    translator.run_config.decode.alpha = 0.25  # as if the run had been configured so
    assert translator.search_settings()["alpha"] == 0.25


def test_evaluate_checks_its_results_folder_before_translating(workdir_copy):
    """An `eval` that is a file stops evaluate.py at once, with one line, before any search."""
    copy = workdir_copy
    shutil.rmtree(copy / "eval", ignore_errors=True)
    (copy / "eval").write_text("")
    result = run("evaluate.py", f"--workdir={copy}", "--split=validation")
    assert result.returncode != 0
    expected = f"error: the results folder {copy / 'eval'} is a file, not a folder"
    assert result.stderr.strip() == expected


def test_unreadable_tokenizer_is_a_translation_error(workdir_copy):
    """A tokenizer that cannot be read (here a folder in its place) is named, not a
    traceback."""
    tokenizer = workdir_copy / "tokenizer.model"
    tokenizer.unlink()
    tokenizer.mkdir()
    with pytest.raises(TranslationError) as error:
        Translator.from_workdir(str(workdir_copy))
    assert str(error.value) == f"cannot read {tokenizer}: Is a directory"


def test_a_replaced_tokenizer_is_refused_by_translation_export_and_training(
        trained_run, workdir_copy, tmp_path):
    """Checkpoints record their tokenizer's SHA-256. tokenizer.model replaced by another of
    the same size (pieces learnt from the same text, each word reversed; its record deleted,
    as a model copied alone): translating, exporting and resuming each stop with one error
    naming the checkpoint, instead of reading and writing ids of other pieces."""
    from transformer_jax.data.tokenizer import Tokenizer, train_tokenizer
    from transformer_jax.export import export
    from transformer_jax.export.manifest import ExportError
    from transformer_jax.trainer import ConfigError

    path = workdir_copy / "tokenizer.model"
    trained_with = Tokenizer.load(path)
    text = [" ".join(word[::-1] for word in pair[side].split())
            for pair in load_split(trained_run.config.data, "train").pairs
            for side in ("source", "target")]
    other = train_tokenizer(text, trained_with.vocab_size)
    assert other.vocab_size == trained_with.vocab_size and other.sha256 != trained_with.sha256
    path.write_bytes(other.model_proto)
    (workdir_copy / "tokenizer.model.json").unlink()
    said = (f"checkpoints/4 was trained with another tokenizer (SHA-256 "
            f"{trained_with.sha256[:12]}...) than the workdir's tokenizer.model "
            f"({other.sha256[:12]}...); put back the one it was trained with")
    with pytest.raises(TranslationError) as translating:
        Translator.from_workdir(str(workdir_copy))
    with pytest.raises(ExportError) as exporting:
        export(str(workdir_copy), str(tmp_path / "exported"), fmt="stablehlo")
    # Training refuses the ids prepared with the old tokenizer; with them deleted too, as
    # that error suggests, the checkpoint is what refuses it.
    shutil.rmtree(workdir_copy / "prepared")
    with pytest.raises(ConfigError) as resuming, \
            pytest.warns(UserWarning, match="tokenizer.model.json', which records them, is"):
        train(shared_run(num_train_steps=6), str(workdir_copy))
    for error in (translating, exporting, resuming):
        assert said in str(error.value)
    assert not (tmp_path / "exported").exists()


def test_missing_checkpoint_dir_raises(tmp_path):
    with pytest.raises(TranslationError, match="no checkpoints"):
        Translator.from_workdir(str(tmp_path))


def test_bleu_while_training_matches_evaluating_the_checkpoint(tmp_path):
    """eval_bleu at step 20 equals sacreBLEU of the saved step-20 model on the same 16 pairs
    (after 20 steps of the tiny model's 2 layers some 4-grams are right: neither score is 0;
    with one layer BLEU is still 0)."""
    config = tiny_run(num_train_steps=20, checkpoint_every_steps=20, log_every_steps=20,
                      eval_every_steps=20,
                      **{"decode.bleu_every_steps": 20, "decode.bleu_examples": 16,
                         "decode.beam_size": 2, "model.num_layers": 2})
    train(config, str(tmp_path))
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    bleu_records = [r for r in logged if "eval_bleu" in r]
    assert [r["step"] for r in bleu_records] == [20]
    pairs = load_split(config.data, "validation").pairs[:16]
    hypotheses = Translator.from_workdir(str(tmp_path)).translate(
        [p["source"] for p in pairs], beam_size=2)
    expected = score(hypotheses, [p["target"] for p in pairs])
    assert expected["bleu"] > 0 and expected["chrf"] > 0
    assert bleu_records[0]["eval_bleu"] == pytest.approx(expected["bleu"])
    assert bleu_records[0]["eval_chrf"] == pytest.approx(expected["chrf"])


def test_translation_restores_the_parameters_alone(trained_run, workdir_copy, tmp_path):
    """A run trained with gradient clipping (one more optimizer stage; a copy of the shared
    run) whose saved optim config no optimizer can be built from translates, from a moved
    workdir, with exactly the parameters it saved: inference never rebuilds the optimizer."""
    config = trained_run.config
    assert config.optim.grad_clip_norm > 0
    with Checkpointer(str(workdir_copy / "checkpoints"), keep=2) as checkpointer:
        model = Transformer(ModelConfig(**checkpointer.metadata(4)["model"]))
        tx = optimizer_from_config(config.optim, model.config.d_model).tx
        saved = checkpointer.restore(4, abstract_train_state(model, tx))[0].params
    for metadata_file in (workdir_copy / "checkpoints").glob("*/metadata/metadata"):
        metadata = json.loads(metadata_file.read_text())
        metadata["config"]["optim"] = {"name": "an optimizer this version does not know"}
        metadata["tokenizer"] = tokenizer_path(str(workdir_copy))  # as if trained there
        metadata_file.write_text(json.dumps(metadata))
    with pytest.raises(KeyError):
        optimizer_from_config(metadata["config"]["optim"], model.config.d_model)
    workdir_copy.rename(tmp_path / "moved")  # the workdir's tokenizer is found anyway
    translator = Translator.from_workdir(str(tmp_path / "moved"))
    assert translator.steps == [4] and len(translator.translate(SENTENCES, beam_size=1)) == 3
    assert jax.tree.structure(translator.params) == jax.tree.structure(saved)
    jax.tree.map(np.testing.assert_array_equal, translator.params, saved)


def test_a_damaged_latest_checkpoint_falls_back_in_translation_and_training(workdir_copy,
                                                                             capsys):
    """Step 4's array data deleted (the parameters' too: translation reads no other array):
    translate.py names the damaged step once and translates with step 2; training moves
    step 4 aside, resumes from step 2 and finishes, comparing its settings with step 2's.
    (Step 4's metadata, which still reads, is made to say bfloat16.)"""
    copy = workdir_copy
    for data_file in array_files(copy / "checkpoints" / "4"):
        data_file.unlink()
    metadata_file = copy / "checkpoints" / "4" / "metadata" / "metadata"
    metadata = json.loads(metadata_file.read_text())
    metadata["model"]["dtype"] = "bfloat16"
    metadata_file.write_text(json.dumps(metadata))
    result = run("translate.py", f"--workdir={copy}", stdin="null\n")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and result.stdout.count("\n") == 1
    assert result.stderr.count("checkpoint 4 cannot be read, using an earlier one") == 1
    assert f"checkpoint 2 of {copy}" in result.stderr
    assert (copy / "checkpoints" / "4").exists()  # readers move nothing
    named = run("translate.py", f"--workdir={copy}", "--checkpoint=4", stdin="null\n")
    assert named.returncode == 1 and "Traceback" not in named.stderr
    assert named.stderr.strip() .startswith("error: checkpoint 4 cannot be read: ")
    with pytest.warns(UserWarning, match="checkpoint 4 cannot be read"):
        resumed = train(shared_run(num_train_steps=6), str(copy))
    assert [r["step"] for r in resumed.records] == [4, 6]
    printed = "".join(capsys.readouterr())
    assert "resumed at step 2; training steps 3-6" in printed and "model.dtype" not in printed
    assert sorted(int(p.name) for p in (copy / "checkpoints").iterdir()
                  if p.name.isdigit()) == [2, 4, 6]
    (aside,) = (copy / "checkpoints-damaged").iterdir()
    assert aside.name.startswith("4-")


@pytest.mark.parametrize("damage", ["arrays deleted", "folders emptied"])
def test_every_checkpoint_damaged_stops_training_instead_of_starting_afresh(workdir_copy,
                                                                            damage, capfd):
    """Every step's arrays deleted (found as the state restores), or every step's folder
    emptied (found as its metadata is read): each step is moved aside with a warning (the
    earliest's saying no earlier one is left), then one error says nothing is left to
    resume from and what a rerun would do, and orbax's own "Metadata file does not exist"
    is not printed. Before, the run started afresh from step 1 without a word, and
    replaced metrics.jsonl's records."""
    from transformer_jax.checkpoint import NoCheckpointReadsError

    copy = workdir_copy
    steps = sorted(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    for step in steps:
        folder = copy / "checkpoints" / str(step)
        for path in (array_files(folder) if damage == "arrays deleted" else folder.iterdir()):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    records = (copy / "metrics.jsonl").read_text()
    with pytest.warns(UserWarning) as warned, pytest.raises(NoCheckpointReadsError) as error:
        train(shared_run(num_train_steps=6), str(copy))
    said = [str(w.message) for w in warned if "cannot be read" in str(w.message)]
    assert [line.split(":")[0] for line in said] == [
        f"checkpoint {step} cannot be read, using an earlier one" for step in steps[:0:-1]] + [
        f"checkpoint {steps[0]} cannot be read, and it is the earliest"]
    directory = copy / "checkpoints"
    assert str(error.value) == (
        f"no checkpoint of {directory} can be read (steps {', '.join(map(str, steps))}, moved "
        f"to {directory}-damaged/; the warnings above say why): nothing to resume from. "
        f"Restore one from a copy, or run again to train afresh from step 1, which replaces "
        f"the run's metrics.jsonl records")
    assert (copy / "metrics.jsonl").read_text() == records
    assert len(list((copy / "checkpoints-damaged").iterdir())) == len(steps)
    assert "Metadata file does not exist" not in capfd.readouterr().err


def test_translate_output_on_a_full_disk_is_one_line_and_no_file(workdir_copy, tmp_path):
    """Writes past 100 bytes fail (the translations of 200 lines are longer: a line each,
    even empty): one line naming the file and the OS error, exit 1, and neither the file nor
    a temporary left behind. The searches JAX saved in the workdir's compilation cache
    meanwhile are cut at 100 bytes too (so the test takes a copy), and are exactly the
    entries the next start removes."""
    cache = workdir_copy / "compilation_cache"
    shutil.rmtree(cache, ignore_errors=True)  # so that the search is compiled and saved
    out = tmp_path / "out" / "translations.txt"
    full = run("translate.py", f"--workdir={workdir_copy}", f"--output={out}",
               "--beam_size=1", stdin="null\n" * 200, max_file_size=100,
               env={"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})  # each one saved
    assert full.returncode == 1 and "Traceback" not in full.stderr
    assert full.stderr.strip().splitlines()[-1] == f"error: cannot write {out}: File too large"
    assert list((tmp_path / "out").iterdir()) == []
    cut = sorted(p.name for p in cache.glob("*-cache") if p.stat().st_size == 100)
    assert any(name.startswith("jit_predict_step-") for name in cut)
    with warnings.catch_warnings(record=True):
        assert drop_damaged_entries(str(cache)) == cut


def test_evaluate_on_a_full_disk_prints_the_scores_and_keeps_earlier_results(workdir_copy):
    """The scores reach stdout; the three result files are not written (one line names the
    first, exit 1), and an earlier result of the same name stays as it was."""
    eval_dir = workdir_copy / "eval"
    eval_dir.mkdir(exist_ok=True)
    (eval_dir / "validation-4-beam1.json").write_text('{"bleu": "earlier"}')
    result = run("evaluate.py", f"--workdir={workdir_copy}", "--split=validation",
                 "--beam_size=1", max_file_size=100)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "sentences, checkpoint 4): BLEU" in result.stdout
    hypotheses = eval_dir / "validation-4-beam1.hyp.txt"
    assert result.stderr.strip().splitlines()[-1] == (f"error: cannot write {hypotheses}: "
                                                       "File too large")
    assert sorted(p.name for p in eval_dir.iterdir()) == ["validation-4-beam1.json"]
    assert (eval_dir / "validation-4-beam1.json").read_text() == '{"bleu": "earlier"}'


def test_ctrl_c_in_translate_is_one_line_and_no_output(workdir, tmp_path):
    """SIGINT while translating, its progress bar drawn: the bar's line ends, then "error:
    interrupted" on its own line, death by SIGINT (130 in a shell), no output file and no
    temporary."""
    (tmp_path / "in.txt").write_text("dreihundertzweiundvierzig\n" * 20_000)
    out = tmp_path / "out.txt"
    process = subprocess.Popen([sys.executable, "translate.py", f"--workdir={workdir}",
                                f"--input={tmp_path / 'in.txt'}", f"--output={out}"],
                               cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert process.stderr.readline().startswith("checkpoint 4 of")  # read; now translating
    shown = ""
    while "translating:" not in shown:  # the progress bar is on its line: no newline yet
        shown += process.stderr.read(1) or pytest.fail(f"translate.py ended: {shown!r}")
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == -signal.SIGINT
    # Its own line: after a newline, not after the bar's "\r" (a terminal would show it
    # over the bar) or glued to the bar's text.
    assert stderr.strip().split("\n")[-1] == "error: interrupted" and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


# Ctrl-C inside interrupt_in_one_line, caught and dropped by code in the block, as JAX drops
# one raised while it traces (the SIGINT reaches the handler inside a `__hash__` that JAX's
# C++ calls) and Python one raised in a `__del__`; `then`: seconds the block goes on after.
LOST_CTRL_C = """
import os, signal, sys, time
from transformer_jax.commands import interrupt_in_one_line

class Dropper:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler raises here, where Python can only drop it

with interrupt_in_one_line():
    if sys.argv[1] == "code":
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        except KeyboardInterrupt:
            pass
    else:
        Dropper()
    print("dropped", flush=True)
    time.sleep(float(sys.argv[2]))
print("ended normally", flush=True)
"""


@pytest.mark.parametrize("where, then", [("code", 30), ("code", 0), ("__del__", 30)])
def test_a_dropped_ctrl_c_is_raised_again(where, then):
    """A KeyboardInterrupt dropped inside the block is raised again 0.2 s later (long before
    the block's 30 s are over), or as the block ends: one line, death by SIGINT, and no
    "Exception ignored" report of the one Python dropped."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", LOST_CTRL_C, where, str(then)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGINT, done.stderr
    assert done.stdout == "dropped\n"
    assert done.stderr.strip().split("\n")[-1] == "error: interrupted"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert time.monotonic() - start < 20



def test_ctrl_c_ends_a_bar_left_open_before_its_one_line():
    """A Ctrl-C inside tqdm's constructor, after it drew the bar, left the bar open: "error:
    interrupted" went on the bar's line (`...?pair/s]error: interrupted`)."""
    script = ("import tqdm\nfrom transformer_jax.commands import interrupt_in_one_line\n"
              "with interrupt_in_one_line():\n"
              "    bar = tqdm.tqdm(total=9, desc='reading', leave=False)  # never closed\n"
              "    raise KeyboardInterrupt\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          timeout=60)  # bytes: text mode would read each "\r" as a line end
    assert done.returncode == -signal.SIGINT
    assert b"reading" in done.stderr  # drawn, then cleared: the error alone on its line
    assert done.stderr.endswith(b"\rerror: interrupted\n"), done.stderr


# --- files whole or not at all, stdout ----------------------------------------------------


def _write_whole_past_50_bytes(texts: dict[str, str]) -> OutputError:
    """The OutputError of write_whole(texts) under a file-size limit of 50 bytes (a full
    disk: EFBIG)."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50, limits[1]))  # Python ignores SIGXFSZ
    try:
        with pytest.raises(OutputError) as error:
            write_whole(texts)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    return error.value


def test_write_whole_changes_nothing_unless_every_file_is_written(tmp_path):
    """The second file passes the file-size limit (a full disk: EFBIG), or Ctrl-C comes
    before it: the first keeps its old text and no temporary is left. Written, the files
    have the mode open() gives, and a link keeps its target."""
    (tmp_path / "a.txt").write_text("old")
    texts = {str(tmp_path / "a.txt"): "new a", str(tmp_path / "b.txt"): "b" * 100}
    error = _write_whole_past_50_bytes(texts)
    assert (error.filename, error.strerror) == (str(tmp_path / "b.txt"), "File too large")

    class InterruptedAfterOne(dict):
        def items(self):
            yield next(iter(super().items()))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_whole(InterruptedAfterOne(texts))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    assert (tmp_path / "a.txt").read_text() == "old"
    (tmp_path / "link.txt").symlink_to("a.txt")
    write_whole(texts)
    assert (tmp_path / "a.txt").read_text() == "new a"
    assert (tmp_path / "b.txt").read_text() == "b" * 100
    write_whole({str(tmp_path / "link.txt"): "through the link"})
    assert (tmp_path / "link.txt").is_symlink()
    assert (tmp_path / "a.txt").read_text() == "through the link"
    with open(tmp_path / "plain.txt", "w"):
        pass
    assert (tmp_path / "b.txt").stat().st_mode == (tmp_path / "plain.txt").stat().st_mode


def test_write_whole_changes_nothing_when_its_first_file_fails(tmp_path):
    """The first of two files passes the file-size limit (a full disk): the second, which
    fits, keeps its old text too. Each is flushed before any replaces its path; closed
    last-opened first, the second would have replaced its path before the first failed."""
    (tmp_path / "b.txt").write_text("old")
    texts = {str(tmp_path / "a.txt"): "a" * 100, str(tmp_path / "b.txt"): "new b"}
    error = _write_whole_past_50_bytes(texts)
    assert error.filename == str(tmp_path / "a.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt"]
    assert (tmp_path / "b.txt").read_text() == "old"


@pytest.mark.parametrize("inner_restores", [True, False])
def test_interrupt_in_one_line_keeps_a_hook_set_inside_in_the_chain(inner_restores):
    """checkpoint.py's filter of orbax's noise, set inside the block and kept after a failed
    read (the noise of its abandoned reads may come after the block), is not replaced by the
    hook from before the block when it ends; a hook still the block's own is."""
    before, inner = sys.unraisablehook, print
    with interrupt_in_one_line():
        inner_previous = sys.unraisablehook
        sys.unraisablehook = inner
        if inner_restores:
            sys.unraisablehook = inner_previous
    try:
        assert sys.unraisablehook is (before if inner_restores else inner)
    finally:
        sys.unraisablehook = before


@pytest.mark.parametrize("before", [signal.default_int_handler, signal.SIG_DFL, signal.SIG_IGN])
def test_interrupt_in_one_line_turns_ctrl_c_on_unless_ignored_and_restores_it(before):
    """Inside the block Ctrl-C is its own, also where a command turned it off while it
    imported (SIG_DFL); an ignored Ctrl-C (SIG_IGN, as nohup and `&` in a script give) stays
    ignored. After the block, the handler is the one from before."""
    signal.signal(signal.SIGINT, before)
    try:
        with interrupt_in_one_line():
            inside = signal.getsignal(signal.SIGINT)
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if before is signal.SIG_IGN:
        assert inside is signal.SIG_IGN
    else:
        assert inside not in (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler)
        assert callable(inside)
    assert after is before


def test_interrupt_in_one_line_drops_only_interrupts_from_the_unraisable_hook(monkeypatch):
    """An error Python could not raise (in a `__del__`) is still reported by the hook from
    before the block; only a KeyboardInterrupt, which the block raises again, is dropped."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    error, interrupt = (types.SimpleNamespace(exc_value=e) for e in (ValueError("x"),
                                                                      KeyboardInterrupt()))
    with interrupt_in_one_line():
        sys.unraisablehook(error)
        sys.unraisablehook(interrupt)
    assert reported == [error]


def test_write_whole_writes_straight_to_what_is_not_a_regular_file():
    """/dev/full is not replaced by a temporary: it is written, and fails as a full disk."""
    # A write_whole that replaced it would leave a regular file there for every later run.
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode), "this machine's /dev/full is no device"
    with pytest.raises(OutputError) as error:
        write_whole({"/dev/full": "text"})
    assert (error.value.filename, error.value.errno) == ("/dev/full", errno.ENOSPC)
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")


def test_write_stdout_reports_a_reader_that_went_away(monkeypatch):
    """A reader that takes 10 bytes of 1 MB and closes the pipe: BrokenPipeError (written in
    one piece, Python's write returns short and says nothing); stdout then goes to
    /dev/null, so that the exit's flush fails no more."""
    read_end, write_end = os.pipe()
    taken = []
    reader = threading.Thread(target=lambda: (taken.append(os.read(read_end, 10)),
                                              os.close(read_end)))
    reader.start()
    monkeypatch.setattr(sys, "stdout", open(write_end, "w", encoding="utf-8"))
    with pytest.raises(BrokenPipeError):
        write_stdout("x" * 1_000_000)
    reader.join()
    assert taken == [b"x" * 10]
    sys.stdout.write("more")
    sys.stdout.flush()  # /dev/null takes it
    sys.stdout.close()


def test_write_stdout_reports_a_reader_gone_before_a_short_text(monkeypatch):
    """6 bytes, less than stdout's buffer, to a pipe whose reader closed it: BrokenPipeError
    from write_stdout itself (it flushes), not later from the exit's flush. Then stdout
    goes to /dev/null."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    monkeypatch.setattr(sys, "stdout", open(write_end, "w", encoding="utf-8"))
    with pytest.raises(BrokenPipeError):
        write_stdout("short\n")
    sys.stdout.write("more")
    sys.stdout.flush()  # /dev/null takes it
    sys.stdout.close()


class _FullStdout:
    """A stdout on a full disk: each write fails with ENOSPC. Its descriptor is a pipe's."""

    def __init__(self):
        self.read_end, self.write_end = os.pipe()

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass

    def fileno(self):
        return self.write_end


def test_write_stdout_and_go_on_is_quiet_for_a_reader_gone_and_warns_once_otherwise(
        capsys, monkeypatch):
    """A reader gone away (`| head`): nothing on stderr and no error. A full disk: one
    warning line on stderr, in words ("No space left on device", not "[Errno 28] ..."),
    and the command goes on."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    monkeypatch.setattr(sys, "stdout", open(write_end, "w", encoding="utf-8"))
    write_stdout_and_go_on("short\n")
    sys.stdout.close()
    full = _FullStdout()
    monkeypatch.setattr(sys, "stdout", full)
    try:
        write_stdout_and_go_on("text\n")
    finally:
        os.close(full.read_end)
        os.close(full.write_end)
    captured = capsys.readouterr()
    assert captured.err == "warning: cannot write to stdout: No space left on device\n"
    assert captured.out == ""


def test_write_stdout_writes_every_piece_whole(capsys):
    """Text longer than a piece (2,500 characters in pieces of 1,024, a two-byte "ä" among
    them) comes out whole and in order: no character lost or repeated at a piece's edge."""
    text = "".join(f"{i:04d}ä" for i in range(500))
    write_stdout(text)
    assert capsys.readouterr().out == text


def test_a_source_longer_than_a_learned_position_table_is_named_before_any_search(workdir):
    """A model of learned positions has no encoding past its table's rows: a longer source
    is a TranslationError naming it, before any search (not a shape error inside one); the
    sources that fit translate."""
    trained = Translator.from_workdir(str(workdir))
    config = dataclasses.replace(trained.model.config, positional_encoding="learned",
                                 max_length=6)
    model = Transformer(config)
    translator = dataclasses.replace(trained, model=model,
                                     params=init_params(model, jax.random.key(0)))
    long = "dreihundertzweiundvierzigtausendsiebenhundertelf"
    length = len(trained.tokenizer.encode_batch([long], add_eos=True)[0])
    assert length > 6
    with pytest.raises(TranslationError) as error:
        translator.translate(["null", long], beam_size=1)
    assert str(error.value) == (
        f"sentence 2 has {length} tokens, more than the 6 rows of the model's learned "
        f"position table (1 sentence(s) too long); split it, or train with a larger "
        f"config.model.max_length")
    assert len(translator.translate(["null", "eins"], beam_size=1)) == 2
