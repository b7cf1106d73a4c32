"""The CTranslate2 export: the same numbers as our model in another engine.

Scores are compared on random weights for each architecture option (teacher-forced
log-probabilities, no search to hide a difference); searches on the shared trained run;
then the CLIs: python -m transformer_jax.export and translate.py --engine=ctranslate2.
"""

import hashlib
import json
import shutil
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest
import sentencepiece

ctranslate2 = pytest.importorskip("ctranslate2")

from run_configs import BAD_SEARCH_SETTINGS, ROOT  # noqa: E402
from transformer_jax.data import load_split  # noqa: E402
from transformer_jax.decoding import length_penalty  # noqa: E402
from transformer_jax.export import QUANTIZATIONS, ExportError, export  # noqa: E402
from transformer_jax.export.manifest import read_manifest  # noqa: E402
from transformer_jax.export.ctranslate2_model import (  # noqa: E402
    CTranslate2Translator, check_expressible, save_model, transformer_spec)
from transformer_jax.model import Transformer  # noqa: E402
from transformer_jax.model_config import get_model_config  # noqa: E402
from transformer_jax.predict import predict  # noqa: E402
from transformer_jax.token_ids import EOS_ID, PAD_ID  # noqa: E402
from transformer_jax.train_state import init_params  # noqa: E402
from transformer_jax.translation import SentenceTooLongError, Translator  # noqa: E402

# In one worker (make test's --dist loadgroup): the export and the test split are made once.
pytestmark = pytest.mark.xdist_group("ctranslate2")

# Distinct sizes, so no transpose of a projection passes by accident.
ARCHITECTURES = {
    "post-LN, sinusoidal (the paper)": {},
    "pre-LN": {"pre_layer_norm": True},
    "learned positions": {"positional_encoding": "learned"},
    "no positions": {"positional_encoding": "none"},
    "no attention biases (the paper's projections)": {"attention_bias": False},
}


def _random_model(tmp_path, **overrides):
    config = get_model_config("tiny", vocab_size=61, d_model=24, d_ff=40, num_heads=3,
                              num_layers=2, max_length=32, layer_norm_epsilon=1e-5,
                              **overrides)
    model = Transformer(config)
    params = init_params(model, jax.random.key(7))
    # Biases and norms start at 0 and 1: make them count.
    params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(x.size), x.shape),
                          params)
    pieces = ["<pad>", "</s>", "<s>", "<unk>"] + [f"p{i}" for i in range(4, 61)]
    save_model(transformer_spec(config, params, pieces, max_positions=32), str(tmp_path))
    return model, params, pieces


def _our_log_probs(model, params, sources, targets) -> list[np.ndarray]:
    """Our teacher-forced log P of each target's tokens, given its source: one array per
    pair, from one padded batch (a source's padding is masked, a target's comes after its
    tokens, which the causal mask keeps from seeing it), in one compiled forward pass."""
    def padded(rows):
        ids = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
        return ids

    inputs_BS, targets_BT = padded(sources), padded(targets)
    logits_BTV = jax.jit(model.apply)({"params": params}, inputs_BS, targets_BT)
    logits_BTV = logits_BTV.at[..., PAD_ID].set(-np.inf)  # never emitted, as in decode_step
    log_probs_BTV = jax.nn.log_softmax(logits_BTV)
    log_probs_BT = np.take_along_axis(np.asarray(log_probs_BTV), targets_BT[..., None], -1)
    return [row[:len(target), 0] for row, target in zip(log_probs_BT, targets)]


@pytest.mark.parametrize("overrides", ARCHITECTURES.values(), ids=ARCHITECTURES.keys())
def test_log_probs_equal_ours(tmp_path, overrides):
    """CTranslate2's log P of every target token (score_batch) equals our teacher-forced
    log-softmax, for sources and targets of several lengths in one batch."""
    model, params, pieces = _random_model(tmp_path, **overrides)
    rng = np.random.default_rng(0)
    sources = [list(rng.integers(4, 61, n)) + [EOS_ID] for n in (5, 11, 2)]
    targets = [list(rng.integers(4, 61, n)) + [EOS_ID] for n in (7, 3, 12)]
    results = ctranslate2.Translator(str(tmp_path)).score_batch(
        [[pieces[i] for i in s[:-1]] for s in sources],  # the model appends both EOS
        [[pieces[i] for i in t[:-1]] for t in targets])  # (config.json's add_source_eos)
    ours = _our_log_probs(model, params, sources, targets)
    for target, result, our_log_probs in zip(targets, results, ours, strict=True):
        assert result.tokens == [pieces[i] for i in target[:-1]] + ["</s>"]
        np.testing.assert_allclose(result.log_probs, our_log_probs, rtol=1e-4, atol=1e-4)


def test_the_output_projection_is_the_embedding_stored_once(tmp_path):
    """Tied weights (§3.4) stay one matrix in model.bin: the file is about the size of
    the parameters, not of three V × D tables."""
    model, params, _ = _random_model(tmp_path)
    table_bytes = params["embedder"]["table"]["embedding"].nbytes
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    positions = 32 * 24 * 4  # one (P, D) float32 table: the encoder's and decoder's are equal
    size = (tmp_path / "model.bin").stat().st_size
    assert total + positions < size < total + positions + table_bytes  # + names, a bias


def test_bfloat16_quantizing_is_quiet(tmp_path):
    """The sinusoidal table was NumPy's read-only view of a JAX array, and CTranslate2's
    bfloat16 quantizing gives its arrays to torch.from_numpy: two lines of PyTorch's
    UserWarning before the export's own. Every array of the spec is writable now."""
    from transformer_jax.export.ctranslate2_model import _positions

    config = get_model_config("tiny", vocab_size=61, d_model=24, d_ff=40, num_heads=3,
                              max_length=32)
    params = init_params(Transformer(config), jax.random.key(7))
    assert _positions(config, params, 32).flags.writeable
    pieces = ["<pad>", "</s>", "<s>", "<unk>"] + [f"p{i}" for i in range(4, 61)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_model(transformer_spec(config, params, pieces, max_positions=32), str(tmp_path),
                   "bfloat16")
    assert (tmp_path / "model.bin").stat().st_size > 0


def test_the_layer_norm_epsilon_is_the_models(tmp_path):
    """CTranslate2 reads the layer norms' ε from config.json; left out, it takes its own
    default (1e-6), and a model trained with another ε gives other numbers (here 1e-5, which
    the log-probability comparison's tolerance would not notice)."""
    _random_model(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["layer_norm_epsilon"] == 1e-5


def test_what_ctranslate2_cannot_hold_is_refused_by_name():
    learned = get_model_config("tiny", positional_encoding="learned", max_length=64)
    check_expressible(learned, max_positions=64)
    with pytest.raises(ExportError, match="positional_encoding='learned'.*max_length=64"):
        check_expressible(learned, max_positions=65)
    check_expressible(get_model_config("tiny", max_length=64), max_positions=1000)


@pytest.fixture(scope="module")
def exported(translating_run, tmp_path_factory):
    """The shared translating run exported in float32 and in int8."""
    root = tmp_path_factory.mktemp("ct2")
    for quantization in ("float32", "int8"):
        export(str(translating_run.workdir), str(root / quantization), fmt="ctranslate2",
               quantization=quantization)
    return root


@pytest.fixture(scope="module")
def test_split(translating_run):
    """The run's test pairs, its model and their source ids."""
    ours = Translator.from_workdir(str(translating_run.workdir))
    pairs = load_split(translating_run.config.data, "test").pairs
    return ours, pairs, ours.tokenizer.encode_batch([p["source"] for p in pairs],
                                                    add_eos=True)


def _until_eos(row) -> list[int]:
    row = [int(i) for i in row]
    return row[:row.index(EOS_ID) + 1] if EOS_ID in row else row


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.6), (4, 0.0)])
def test_searches_without_length_penalty_give_our_ids(test_split, exported, beam_size, alpha):
    """Greedy search, and beam-4 search with α = 0 (where the length penalties agree), give
    our output ids for at least 99 % of the test sources."""
    ours, _, ids = test_split
    settings = dict(beam_size=beam_size, alpha=alpha, max_extra_length=10)
    expected = [_until_eos(r) for r in predict(ours.model, ours.params, ids, **settings)]
    theirs = CTranslate2Translator.from_export(str(exported / "float32")).translate_ids(
        ids, **settings)
    same = sum(a == _until_eos(b) for a, b in zip(expected, theirs))
    assert same >= 0.99 * len(ids), f"{same} of {len(ids)} equal"


def test_beam_searches_with_alpha_differ_only_where_their_length_penalties_do(test_split,
                                                                            exported):
    """Beam 4, α = 0.6 (§6.1): we divide a hypothesis's log P by ((5 + |Y|) / 6)^α (GNMT's),
    CTranslate2 by |Y|^α, which favours longer outputs. Where the two outputs differ (|Y|
    counting EOS, log P rescored by our model), each is the better of the two by its own
    engine's penalty, and CTranslate2's is the longer."""
    ours, _, ids = test_split
    settings = dict(beam_size=4, alpha=0.6, max_extra_length=10)
    expected = [_until_eos(r) for r in predict(ours.model, ours.params, ids, **settings)]
    theirs = CTranslate2Translator.from_export(str(exported / "float32")).translate_ids(
        ids, **settings)
    differing = [(i, a, b) for i, (a, b) in enumerate(zip(expected, theirs)) if a != b]
    assert differing  # 3 of 200 test sentences of the translating run
    log_p = [row.sum() for row in _our_log_probs(  # ours, theirs; ours, theirs; ...
        ours.model, ours.params, [ids[i] for i, _, _ in differing for _ in range(2)],
        [y for _, ours_ids, their_ids in differing for y in (ours_ids, their_ids)])]
    for (_, ours_ids, their_ids), ours_log_p, their_log_p in zip(
            differing, log_p[0::2], log_p[1::2], strict=True):
        short, long = len(ours_ids), len(their_ids)
        assert long > short
        assert (ours_log_p / length_penalty(short, 0.6)
                > their_log_p / length_penalty(long, 0.6))
        assert their_log_p / long ** 0.6 > ours_log_p / short ** 0.6


def test_export_json_holds_the_runs_search_and_the_arguments_that_search_so(trained_run,
                                                                          tmp_path):
    """The search settings of the run's own config.decode (here changed in a copy of its
    newest checkpoint's metadata), and the translate_batch arguments a client without this
    package passes (docs/serving.md): patience 4, the run's α as length_penalty, outputs
    that may end at once."""
    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    newest = str(trained_run.config.num_train_steps)
    metadata_file = workdir / "checkpoints" / newest / "metadata" / "metadata"
    metadata = json.loads(metadata_file.read_text())
    metadata["config"]["decode"].update(beam_size=3, alpha=0.25, max_extra_length=7)
    metadata_file.write_text(json.dumps(metadata))
    manifest = export(str(workdir), str(tmp_path / "out"), fmt="ctranslate2")
    assert manifest["search"] == {"beam_size": 3, "alpha": 0.25, "max_extra_length": 7}
    assert manifest["ctranslate2_options"] == {"beam_size": 3, "patience": 4,
                                               "length_penalty": 0.25,
                                               "min_decoding_length": 0}
    assert json.loads((tmp_path / "out" / "export.json").read_text())["search"] == \
        manifest["search"]


def test_int8_stores_a_byte_per_weight_and_translates(exported, test_split):
    """int8 keeps each matrix weight in one byte instead of four (plus a float scale per
    row); biases, norms and the position table stay float32."""
    ours, _, _ = test_split
    matrix_weights = sum(x.size for x in jax.tree.leaves(ours.params) if x.ndim >= 2)
    float32, int8 = ((exported / q / "model.bin").stat().st_size for q in ("float32", "int8"))
    assert 0.95 * 3 * matrix_weights < float32 - int8 < 3 * matrix_weights
    manifest = json.loads((exported / "int8" / "export.json").read_text())
    assert manifest["quantization"] == "int8" and manifest["format"] == "ctranslate2"
    out = CTranslate2Translator.from_export(str(exported / "int8")).translate(
        ["dreihundertzwei", "null"], beam_size=2)
    assert len(out) == 2 and all(isinstance(t, str) for t in out)


def test_translate_refuses_what_translator_refuses(exported, monkeypatch):
    """CTranslate2Translator.translate refuses the settings, and the one str, that
    Translator.translate refuses, in the same words, before any search."""
    theirs = CTranslate2Translator.from_export(str(exported / "float32"))
    monkeypatch.setattr(theirs, "translate_ids", lambda *a, **k: pytest.fail("searched"))
    for setting, message in BAD_SEARCH_SETTINGS:
        with pytest.raises(ValueError) as error:
            theirs.translate(["null"], **setting)
        assert str(error.value) == message
    with pytest.raises(TypeError, match="^translate takes a list of sentences, not one str"):
        theirs.translate("null")


def test_outputs_and_sources_stay_within_the_exported_positions(translating_run, test_split,
                                                                 tmp_path):
    """Exported with --max_positions=P (one less than the longest test source): every output
    stops by P tokens (CTranslate2 itself fails at position P), and a longer source is
    refused by name before any search."""
    _, pairs, ids = test_split
    positions = max(map(len, ids)) - 1
    export(str(translating_run.workdir), str(tmp_path / "short"), fmt="ctranslate2",
           max_positions=positions)
    theirs = CTranslate2Translator.from_export(str(tmp_path / "short"))
    fitting = [i for i in ids if len(i) <= positions][:50]
    outputs = theirs.translate_ids(fitting, beam_size=2, alpha=0.6, max_extra_length=50)
    assert max(map(len, outputs)) == positions  # some reach the end of the table
    longer, length = next((pair["source"], len(i)) for pair, i in zip(pairs, ids)
                          if len(i) > positions)
    with pytest.raises(SentenceTooLongError) as error:
        theirs.translate(["null", longer])
    assert str(error.value) == (f"sentence 2 has {length} tokens, more than the export's "
                                f"max_positions={positions} (1 sentence(s) too long); split "
                                f"it or export with a larger --max_positions")


def _run(*args, stdin=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=300)


def test_translate_py_with_ctranslate2_equals_jax(translating_run, exported):
    lines = "dreihundertzweiundvierzig\nnull\neinundzwanzigtausendfünf\n"
    common = ["translate.py", "--beam_size=1", "--max_extra_length=8"]
    jax_run = _run(*common, f"--workdir={translating_run.workdir}", stdin=lines)
    ct2_run = _run(*common, "--engine=ctranslate2", f"--exported={exported / 'float32'}",
                   stdin=lines)
    assert jax_run.returncode == 0 and ct2_run.returncode == 0, ct2_run.stderr
    assert ct2_run.stdout == jax_run.stdout and len(ct2_run.stdout.splitlines()) == 3
    assert ct2_run.stderr.startswith(
        f"ctranslate2 export of checkpoint {translating_run.config.num_train_steps} of ")


@pytest.mark.parametrize("args, message", [
    (["--engine=ctranslate2", "--workdir=W"], "--engine=ctranslate2 translates with "
                                              "--exported=DIR, not --workdir"),
    (["--engine=stablehlo", "--exported=E"], "holds a ctranslate2 export, not stablehlo"),
    (["--engine=ctranslate2", "--exported=E", "--checkpoint=2"], "--checkpoint is for "
                                                                  "--engine=jax"),
    (["--engine=ctranslate2", "--exported=E", "in.txt"],  # read stdin, ignoring in.txt
     "error: unexpected arguments 'in.txt': flags are --name=value, e.g. --workdir=runs/default "
     "--input=FILE --output=FILE"),
])
def test_translate_py_engine_errors_are_one_line(exported, args, message):
    args = [a.replace("=E", f"={exported / 'float32'}") for a in args]
    result = _run("translate.py", *args, stdin="null\n")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_export_cli_refuses_an_existing_output_and_leaves_nothing_half_made(trained_run,
                                                                           tmp_path):
    """The output is checked before the checkpoints are read (minutes for a big model
    averaged): here the workdir does not exist, and the output is what is named."""
    output = tmp_path / "out"
    output.mkdir()
    (output / "export.json").write_text("{}")
    result = _run("-m", "transformer_jax.export", f"--workdir={tmp_path / 'no_run'}",
                  "--format=ctranslate2", f"--output={output}")
    assert result.stderr == (f"error: --output {output} holds an earlier export; choose "
                             f"another or pass --force to replace it\n")
    assert result.returncode == 1
    bad = _run("-m", "transformer_jax.export", f"--workdir={trained_run.workdir}",
               "--format=ctranslate2", f"--output={tmp_path / 'new'}", "--checkpoint=3")
    assert bad.returncode == 1 and "checkpoint '3'" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial folder left


def test_a_damaged_ctranslate2_export_is_one_error(exported, tmp_path):
    """An export without its tokenizer got the advice for a training run, and an export.json
    without its search settings a KeyError."""
    damaged = tmp_path / "damaged"
    shutil.copytree(exported / "float32", damaged)
    (damaged / "tokenizer.model").unlink()
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(damaged))
    assert str(error.value) == f"{damaged} has no tokenizer.model; export again"
    manifest = json.loads((damaged / "export.json").read_text())
    del manifest["search"], manifest["steps"]
    (damaged / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(damaged))
    assert str(error.value) == f"{damaged / 'export.json'} lacks steps, search; export again"
    # Edited by hand, valid JSON: a KeyError or TypeError where it was read.
    whole = json.loads((exported / "float32" / "export.json").read_text())
    for key, value, problem in (("model", {}, "model.max_length must be an integer"),
                                ("steps", None, "steps must be a list of checkpoint steps, "
                                                "got None"),
                                ("search", {"beam_size": 4}, "search must hold beam_size, "
                                                             "alpha and max_extra_length")):
        (damaged / "export.json").write_text(json.dumps({**whole, key: value}))
        with pytest.raises(ExportError) as error:
            read_manifest(str(damaged), "ctranslate2")
        assert str(error.value) == f"{damaged / 'export.json'}: {problem}; export again"
    with pytest.raises(ExportError) as error:  # a file of the folder named in its place
        read_manifest(str(exported / "float32" / "model.bin"), "ctranslate2")
    assert str(error.value) == (f"{exported / 'float32' / 'model.bin'}: a file, not an "
                                f"exported model's folder (the folder holding export.json)")


def test_a_model_ctranslate2_cannot_load_or_of_other_pieces_is_one_error(exported, tmp_path):
    """A model.bin cut short (an interrupted copy), and a vocabulary whose pieces are not the
    tokenizer's (two swapped: every id would decode to the wrong word), are ExportErrors."""
    damaged = tmp_path / "damaged"
    shutil.copytree(exported / "float32", damaged)
    model = (damaged / "model.bin").read_bytes()
    (damaged / "model.bin").write_bytes(model[:len(model) // 2])
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(damaged))
    assert str(error.value).startswith(f"CTranslate2 cannot load {damaged}: ")
    assert "\n" not in str(error.value)
    (damaged / "model.bin").write_bytes(model)
    pieces = json.loads((damaged / "shared_vocabulary.json").read_text())
    pieces[5], pieces[6] = pieces[6], pieces[5]
    (damaged / "shared_vocabulary.json").write_text(json.dumps(pieces))
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(damaged))
    assert str(error.value) == (f"{damaged}'s tokenizer.model has other pieces than its "
                                f"model's vocabulary; export again")


@pytest.mark.parametrize("flags, message", [
    (["--format=ctranslate2", "--lengths=8"],
     "--lengths is for --format=stablehlo, not --format=ctranslate2"),
    (["--format=stablehlo", "--quantization=int8", "--max_positions=8"],
     "--quantization and --max_positions are for --format=ctranslate2, not --format=stablehlo"),
    (["--format=stablehlo", "--batch_sizes=0"],
     "--batch_sizes and --lengths are lists of positive integers, e.g. --lengths=16,32,64"),
    (["--format=ctranslate2", "exports/old"],
     "unexpected arguments 'exports/old': flags are --name=value, e.g. --workdir=runs/default "
     "--format=ctranslate2 --output=OUT"),
])
def test_export_cli_refuses_the_other_formats_flags(flags, message, tmp_path):
    """Flags of the other format were ignored; they are refused before any work."""
    result = _run("-m", "transformer_jax.export", f"--workdir={tmp_path / 'none'}",
                  f"--output={tmp_path / 'out'}", *flags)
    assert result.returncode == 1 and result.stderr == f"error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_sources_end_with_our_eos_in_any_ctranslate2_client(translating_run, test_split,
                                                            exported):
    """A client that passes the SentencePiece pieces alone (the usual recipe) changed 2 of
    100 translations: our sources end with EOS. The model's config.json now adds it. An
    output of ours that reached its length limit (S + 10) without EOS is compared with the
    start of CTranslate2's, which goes on to 64 tokens (the tiny model repeats itself on a
    few sources)."""
    config = json.loads((exported / "float32" / "config.json").read_text())
    assert config["add_source_eos"] is True and config["add_source_bos"] is False
    ours, pairs, ids = test_split
    client = ctranslate2.Translator(str(exported / "float32"))
    sources = [ours.tokenizer.encode_batch([p["source"]])[0] for p in pairs[:100]]
    pieces = [[ours.tokenizer.id_to_piece(int(i)) for i in s] for s in sources]
    assert all(p and p[-1] != "</s>" for p in pieces)
    results = client.translate_batch(pieces, beam_size=1, min_decoding_length=0,
                                     max_decoding_length=64)
    expected = predict(ours.model, ours.params, ids[:100], beam_size=1, alpha=0.0,
                       max_extra_length=10)

    def agree(row, theirs) -> bool:
        row = _until_eos(row)
        pieces = [ours.tokenizer.id_to_piece(i) for i in row if i != EOS_ID]
        return pieces == (theirs if row[-1] == EOS_ID else theirs[:len(pieces)])

    same = sum(agree(e, r.hypotheses[0]) for e, r in zip(expected, results))
    assert same >= 99, f"{same} of 100 equal"


class _Result:
    def __init__(self, hypotheses):
        self.hypotheses = hypotheses


def test_a_finished_hypothesis_wins_over_a_longer_cut_one():
    """At the output limit ours prefers a finished hypothesis (decoding.beam_search);
    CTranslate2's first may be cut there. Every beam hypothesis is asked for, the best
    finished taken, the source's EOS left to the model (add_source_eos)."""
    calls = []

    class Fake:
        def translate_batch(self, tokens, **options):
            calls.append((tokens, options))
            return [_Result([["a", "b", "c"], ["a", "</s>"], ["b", "</s>"]]),
                    _Result([["c", "c", "c"], ["c", "c", "b"]])]  # none finished

    pieces = ["<pad>", "</s>", "<s>", "<unk>", "a", "b", "c"]
    translator = CTranslate2Translator(Fake(), pieces, search={}, max_positions=64,
                                       adds_eos=True)
    outputs = translator.translate_ids([[4, 5, 1], [6, 1]], beam_size=3, alpha=0.6,
                                       max_extra_length=2)
    (tokens, options), = calls
    assert tokens == [["c"], ["a", "b"]]  # the shorter first, as predict.py sorts them
    assert outputs == [[6, 6, 6], [4, 1]]  # none finished: the best; else the best finished
    assert options["num_hypotheses"] == 3 and options["max_decoding_length"] == 8 + 2


def test_the_output_limit_counts_the_sources_eos_as_predict_does():
    """predict.py pads a batch to its longest source in ids, EOS included, rounded up to a
    multiple of 8: 8 pieces and EOS make 16. The engine's limit is that + max_extra_length,
    whether it passes the EOS or leaves it to the model (add_source_eos), which makes the
    source a piece shorter."""
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "a"]
    for adds_eos in (True, False):
        calls = []

        class Fake:
            def translate_batch(self, tokens, **options):
                calls.append((tokens, options))
                return [_Result([["a", "</s>"]])]

        translator = CTranslate2Translator(Fake(), pieces, search={}, max_positions=64,
                                           adds_eos=adds_eos)
        assert translator.translate_ids([[4] * 8 + [1]], beam_size=2, alpha=0.6,
                                        max_extra_length=2) == [[4, 1]]
        (tokens, options), = calls
        assert tokens == [["a"] * 8 + ([] if adds_eos else ["</s>"])]
        assert options["max_decoding_length"] == 16 + 2


def test_export_arguments_are_checked_before_the_checkpoints_are_read(tmp_path):
    """An option of the other format reached transformer_spec's TypeError, a bad
    max_positions an IndexError inside CTranslate2, both after the whole restore. The
    workdir here does not exist: each error comes first."""
    run = str(tmp_path / "no_run")
    for kwargs, message in [
            ({"fmt": "ctranslate2", "lengths": (16,)},
             "lengths is an option of format stablehlo, not ctranslate2"),
            ({"fmt": "stablehlo", "quantization": "int8"},
             "quantization is an option of format ctranslate2, not stablehlo"),
            ({"fmt": "stablehlo", "bucket": 3},
             "bucket is no option of format stablehlo; its options are batch_sizes, lengths, "
             "platforms"),
            ({"fmt": "ctranslate2", "max_positions": 0},
             "max_positions must be a positive integer, got 0"),
            ({"fmt": "ctranslate2", "max_positions": "64"},
             "max_positions must be a positive integer, got '64'"),
            ({"fmt": "onnx"}, "fmt='onnx': choose one of ctranslate2, stablehlo"),
            ({"fmt": "ctranslate2", "quantization": "int4"},
             "quantization='int4': choose one of " + ", ".join(QUANTIZATIONS)),
            ({"fmt": "stablehlo", "lengths": "16,32"},
             "lengths must be a sequence of positive integers, got '16,32'"),
            ({"fmt": "stablehlo", "lengths": (16, 0)}, "lengths must be positive integers, "
                                                       "got [16, 0]"),
            ({"fmt": "ctranslate2", "beam_size": 0}, "beam_size=0: 0 is not a positive "
                                                     "integer")]:
        with pytest.raises(ExportError) as error:
            export(run, str(tmp_path / "out"), **kwargs)
        assert str(error.value) == message
    from transformer_jax.export.stablehlo import check_options
    assert check_options(lengths=16, batch_sizes=(8, 1, 8))["lengths"] == (16,)  # one bucket
    assert check_options(lengths=16, batch_sizes=(8, 1, 8))["batch_sizes"] == (1, 8)


def test_without_ctranslate2_the_format_says_how_to_install_it(exported, tmp_path,
                                                               monkeypatch):
    """Exporting, and loading an export (which said "CTranslate2 cannot load DIR: ...", as
    if the export were damaged)."""
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import raises ImportError
    install = ("the ctranslate2 format needs the ctranslate2 package: pip install "
               "'transformer_jax[serve]' (or pip install ctranslate2)")
    with pytest.raises(ExportError) as error:
        export(str(tmp_path / "run"), str(tmp_path / "out"), fmt="ctranslate2")
    assert str(error.value) == install
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(exported / "float32"))
    assert str(error.value) == install


def test_another_or_a_damaged_tokenizer_is_refused(exported, trained_run, tmp_path):
    """An export's tokenizer.model replaced by another model's translated into nonsense
    silently, and a damaged one in the workdir was a traceback from the export command."""
    swapped = tmp_path / "swapped"
    shutil.copytree(exported / "float32", swapped)
    manifest = json.loads((swapped / "export.json").read_text())
    assert manifest["tokenizer_sha256"] == Translator.from_workdir(
        manifest["workdir"]).tokenizer.sha256
    sha = manifest["tokenizer_sha256"]
    manifest["tokenizer_sha256"] = "0" * 64  # as if exported with another tokenizer
    (swapped / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(swapped))
    assert str(error.value) == (f"{swapped / 'tokenizer.model'} is not the tokenizer this "
                                f"model was exported with (SHA-256 {sha[:12]}..., exported "
                                f"000000000000...); export again")
    # A whole SentencePiece model of other special ids was "damaged" here and "not the
    # tokenizer this model was exported with" in the stablehlo engine: now both say the latter.
    other = tmp_path / "other"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["eins zwei drei vier fünf sechs sieben acht neun zehn"] * 50),
        model_prefix=str(other), vocab_size=30, model_type="char", hard_vocab_limit=False)
    (swapped / "tokenizer.model").write_bytes((tmp_path / "other.model").read_bytes())
    manifest["tokenizer_sha256"] = sha
    (swapped / "export.json").write_text(json.dumps(manifest))
    other_sha = hashlib.sha256((tmp_path / "other.model").read_bytes()).hexdigest()
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(swapped))
    assert str(error.value) == (f"{swapped / 'tokenizer.model'} is not the tokenizer this "
                                f"model was exported with (SHA-256 {other_sha[:12]}..., "
                                f"exported {sha[:12]}...); export again")
    (swapped / "tokenizer.model").write_bytes(b"junk")  # in an export without a SHA-256
    del manifest["tokenizer_sha256"]
    (swapped / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError) as error:
        CTranslate2Translator.from_export(str(swapped))
    assert str(error.value) == (f"{swapped / 'tokenizer.model'} is damaged (not the "
                                f"SentencePiece model exported); export again")
    run = tmp_path / "run"
    shutil.copytree(trained_run.workdir / "checkpoints", run / "checkpoints")
    (run / "tokenizer.model").write_bytes(b"garbage")
    result = _run("-m", "transformer_jax.export", f"--workdir={run}", "--format=ctranslate2",
                  f"--output={tmp_path / 'out'}")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {run / 'tokenizer.model'} is damaged")
    assert not (tmp_path / "out").exists()


def test_a_training_run_and_an_export_each_name_the_other_flag(exported, trained_run):
    from transformer_jax.trained_params import CheckpointChoiceError, load_trained_params

    with pytest.raises(ExportError) as error:
        read_manifest(str(trained_run.workdir), "ctranslate2")
    assert str(error.value) == (f"{trained_run.workdir} is a training run, not an export; "
                                f"translate with --engine=jax --workdir={trained_run.workdir}, "
                                f"or export it with python -m transformer_jax.export")
    with pytest.raises(CheckpointChoiceError) as error:
        load_trained_params(str(exported / "int8"))
    assert str(error.value) == (f"{exported / 'int8'} is an export, not a training run; "
                                f"translate with translate.py --engine=ctranslate2 "
                                f"--exported={exported / 'int8'}")
