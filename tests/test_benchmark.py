"""The benchmark CLI: every suite runs (--quick), reports positive figures and counts right."""

import dataclasses
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import types
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import Transformer, count_parameters, get_model_config
from transformer_jax.benchmark import SUITES, decode, flops, machine, report, timing
from transformer_jax.benchmark import attention as attention_suite
from transformer_jax.benchmark import model as model_suite
from transformer_jax.benchmark.__main__ import main, parse_args
from transformer_jax.benchmark.model import model_configs, synthetic_batch
from transformer_jax.benchmark.pipeline import _counts
from transformer_jax.benchmark.timing import alternated_steps, compile_seconds
from transformer_jax.decoding import UNROLL
from transformer_jax.optim import make_optimizer
from transformer_jax.parallel import Parallel
from transformer_jax.train_state import create_train_state, init_params

# Fields each suite's JSON rows must hold with positive values.
POSITIVE = {
    "attention": ("ms", "tflops", "peak_tflops", "peak_fraction", "memory_bytes"),
    "model": ("step_ms", "tokens_per_sec", "compile_s", "state_s", "tflops", "mfu",
              "memory_bytes"),
    "decode": ("ms", "tokens_per_sec", "sentences_per_sec", "compile_s", "vs_unroll_1"),
    "pipeline": ("batches_per_sec", "examples_per_sec", "tokens_per_sec", "source_fill",
                 "target_fill", "first_batch_s", "resume_s", "prepare_s", "pairs_per_sec",
                 "threads_prepare_s", "threads_pairs_per_sec"),
    "compare": ("step_ms", "tflops"),
    "loss": ("ms", "tflops", "compile_s", "memory_bytes"),
}


# The column that names each suite's rows.
LABEL = {"attention": "implementation", "model": "model", "decode": "search",
         "pipeline": "data", "compare": "framework", "loss": "method"}


@pytest.mark.parametrize("suite", SUITES)
def test_every_suite_reports_positive_figures(suite, tmp_path, capsys, monkeypatch):
    written = []  # each document the suite wrote, as it was then
    write_json = report.write_json
    monkeypatch.setattr(report, "write_json", lambda path, document: (
        written.append(json.loads(json.dumps(document))), write_json(path, document)))
    if suite == "compare":
        pytest.importorskip("torch", reason="the compare suite's peer is PyTorch ('.[bench]')")
    path = tmp_path / f"{suite}.json"
    # The model suite with a ModelConfig field set to another value than its default (16),
    # loss chunks of its choosing (--quick's own are 0 and 64), and train.py's strategy
    # alone (the tests of --vary time both).
    vary = (["--vary", "dropout_bits=8", "--loss-chunks=0,32", "--strategies=pmap"]
            if suite == "model" else [])
    assert main([suite, "--quick", f"--json={path}", *vary]) == 0
    result = json.loads(path.read_text())
    assert result["suite"] == suite and result["quick"] is True and result["complete"] is True
    # Each row was written as it was measured, in the table's order, before the whole report.
    *partial, whole = written
    assert whole == result and [len(doc["results"]) for doc in partial] == list(
        range(1, len(result["results"]) + 1))
    assert not any(doc["complete"] or doc["notes"] for doc in partial)
    assert [row.get(LABEL[suite]) for row in partial[-1]["results"]] == [
        row.get(LABEL[suite]) for row in result["results"]]
    assert result["argv"] == [suite, "--quick", f"--json={path}", *vary]
    about = result["machine"]
    assert about["jax"] == jax.__version__ and about["cpu_count"] >= 1 and about["device_kind"]
    assert "commit" in about and about["transformer_jax"] == metadata.version("transformer_jax")
    assert result["results"], "no rows"
    if suite in ("attention", "model", "compare"):  # the notes give the peak MFU divides by
        peaks = {m[1]: float(m[2]) for note in result["notes"] if (m := re.match(
            r"peak \((\w+), for mfu\): ([\d.e+]+) TFLOP/s, ", note))}
        assert peaks, result["notes"]
        for row in result["results"]:
            share = row.get("mfu") or row.get("peak_fraction")
            if share:
                if "dtype" in row:
                    peak = peaks[row["dtype"]]
                else:  # compare's: one dtype, float32 on a CPU, bfloat16 on a GPU
                    (peak,) = peaks.values()
                assert share == pytest.approx(row["tflops"] / peak, rel=1e-3), row
    for row in result["results"]:
        for field in POSITIVE[suite]:
            if field in row:
                assert row[field] > 0, (field, row)
    present = {field for row in result["results"] for field in row}
    assert set(POSITIVE[suite]) <= present
    if suite in ("attention", "model", "decode", "loss"):  # --quick times 3 calls of each
        assert all(row["timed"] == 3 and 0 <= row["spread"] < math.inf
                   for row in result["results"] if "ms" in row or "step_ms" in row)
    if suite == "pipeline":  # fills are shares; a resume gives the batch read the first time
        assert all(row.get(f, 0) <= 1 for row in result["results"] for f in ("source_fill",
                                                                               "target_fill"))
        assert [row["resumed_exactly"] for row in result["results"] if "resume_s" in row] == [
            True, True]  # packed and bucketed
        (prepared,) = [row for row in result["results"] if row["stage"] == "prepare"]
        assert prepared["processes"] == 0 and prepared["processes_over_threads"] is None
    if suite == "attention":
        assert_attention_masks(result)
    if suite == "compare":
        assert_compare_peers(result)
    if suite == "model":
        assert [(row["strategy"], row["loss_chunk"], row["dropout_bits"])
                for row in result["results"]] == [("pmap", 0, 8), ("pmap", 32, 8)]
    if suite == "decode":  # beam search also at 1 step per loop iteration, beside its default
        assert [(row["search"], row["cache"], row["unroll"]) for row in result["results"]] == [
            ("greedy", "cached", 1), ("greedy", "uncached", 1), ("beam4", "cached", UNROLL),
            ("beam4", "uncached", UNROLL), ("beam4", "cached", 1)]
    if suite == "loss":
        assert [row["method"] for row in result["results"]][:4] == [
            "whole", "chunks", "2 passes", "optax"]
        assert result["results"][0]["vs_whole"] == 1.0
    assert "tflops" in capsys.readouterr().out or suite in ("decode", "pipeline")


def assert_attention_masks(result):
    """--quick attention: the grid's rows have no mask; the packed causal rows at the tiny
    model's shape time each of our implementations, forward and fwd+bwd, with float32
    "xla" within float32 rounding of the reference (TF32 matmuls on a GPU); the GPU-only
    ones are named as skipped on a CPU."""
    rows = result["results"]
    assert {row["mask"] for row in rows if "model" not in row} == {"none"}
    packed = {(row["implementation"], row["pass"]): row for row in rows if "model" in row}
    ours = {(name, p) for name in ("auto", "reference", "xla") for p in ("forward", "fwd+bwd")}
    assert ours <= set(packed) <= ours | {("pallas_mha", p) for p in ("forward", "fwd+bwd")}
    for row in packed.values():
        assert (row["model"], row["mask"], row["causal"], row["dtype"]) == (
            "tiny", "packed", True, "float32")
        assert (row["num_heads"], row["head_dim"]) == (4, 8)  # the tiny model's
        assert 0 < row["ms"] < float("inf") and 0 <= row["error"] < float("inf")
    bound = 1e-5 if jax.default_backend() == "cpu" else 1e-2
    assert all(row["error"] < bound for (name, _), row in packed.items() if name == "xla")
    if jax.default_backend() == "cpu":
        skipped = next(note for note in result["notes"] if note.startswith("skipped: "))
        assert "cudnn at float32: needs an NVIDIA GPU" in skipped
        assert "pallas_mha at float32: needs an NVIDIA GPU (Triton)" in skipped


def assert_compare_peers(result):
    """compare: torch's train step beside ours on the same B x T tokens, the tokens/s ratio
    the inverse ratio of the step times; the attention peer is torch's flash SDPA on a GPU
    (where a PyTorch user would call it), Flax's attention on a CPU."""
    rows = result["results"]
    frameworks = [row["framework"] for row in rows]
    assert any(f.startswith("torch") for f in frameworks)
    if jax.default_backend() == "gpu":
        assert any(f.startswith("torch") and f.endswith("SDPA (flash)") for f in frameworks)
    else:
        assert "flax nn.dot_product_attention" in frameworks
    ours = [row for row in rows if row["framework"].startswith("transformer_jax (")]
    torch_rows = [row for row in rows if row["framework"].startswith("torch")]
    assert ours[0]["batch"] * ours[0]["length"] == torch_rows[0]["batch"] * torch_rows[0]["length"]
    assert ours[0]["ratio"] == pytest.approx(torch_rows[0]["step_ms"] / ours[0]["step_ms"],
                                             rel=1e-6)
    # Each attention row says what was timed: its TFLOP/s are eq. 1's FLOPs of its shape
    # over its time (the CPU's rows had no heads, head_dim or pass to rebuild them from).
    attention_rows = [row for row in rows if "head_dim" in row]
    assert len(attention_rows) >= 2
    for row in attention_rows:
        work = flops.attention_flops(row["batch"], row["length"], row["length"], row["heads"],
                                     row["head_dim"], causal=row["causal"],
                                     backward=row["pass"] != "forward")
        assert row["tflops"] == pytest.approx(work / (row["step_ms"] / 1e3) / 1e12, rel=1e-6)


def test_attention_error_sees_a_wrong_mask_and_checks_the_pallas_peer():
    """The error against the packed reference: about 1 for attention that ignores the
    segments, float32 rounding for XLA's with them, and for Pallas's kernel (interpreted on
    this host) given the segment ids: its arguments are wired as our mask means."""
    import functools

    from transformer_jax.benchmark import attention

    def errors(attend, given):
        return attention.relative_errors(
            attention.outputs(attend, qkv, given, causal=True, dtype=jnp.float32), reference)

    with jax.default_device(jax.devices("cpu")[0]):  # float32 matmuls, no TF32
        segments = attention.mask_segments("packed", 2, 32, (3, 12), seed=4)
        assert len(np.unique(np.asarray(segments[0][0]))) >= 3  # examples and padding
        qkv = attention.random_qkv(2, 32, 2, 16, "float32")
        reference = attention.outputs(attention.ours("reference"), qkv, segments, causal=True,
                                      dtype=jnp.float32)
        assert min(errors(attention.ours("xla"), ())) > 0.3
        assert max(errors(attention.ours("xla"), segments)) < 1e-5
        pallas = functools.partial(attention.pallas_mha, interpret=True)
        assert max(errors(pallas, segments)) < 1e-5


def test_cross_attention_segments_keep_the_examples_in_order():
    """Each row's source holds the target's examples in the same order, each with half to
    all of its target length, then padding."""
    from transformer_jax.benchmark.attention import source_segments_BS
    from transformer_jax.benchmark.model import packed_segments_BT

    rng = np.random.default_rng(2)
    targets = packed_segments_BT(rng, 6, 64)
    sources = source_segments_BS(rng, targets)
    assert sources.shape == targets.shape and (sources != targets).any()
    for target_row, source_row in zip(targets, sources):
        used = source_row[source_row > 0]
        assert (source_row[used.size:] == 0).all() and (np.diff(used) >= 0).all()
        ids, target_sizes = np.unique(target_row[target_row > 0], return_counts=True)
        source_ids, source_sizes = np.unique(used, return_counts=True)
        assert (source_ids == ids).all()
        assert ((target_sizes + 1) // 2 <= source_sizes).all()
        assert (source_sizes <= target_sizes).all()


def test_decode_peers_time_ctranslate2_beside_ours_on_the_same_outputs(tmp_path, capsys):
    """decode --peers: each search by ours, CTranslate2 float32 and int8; tokens/s are the
    engine's own output tokens over its time, ratios are against CTranslate2 float32, and
    CTranslate2 float32 writes our outputs (random tiny weights). Its first line names it
    as its JSON file does (it said "decode on ...", as the plain suite)."""
    pytest.importorskip("ctranslate2", reason="the peer is CTranslate2 ('.[serve]')")
    path = tmp_path / "peers.json"
    assert main(["decode", "--peers", "--quick", f"--json={path}"]) == 0
    assert capsys.readouterr().out.startswith("decode --peers on ")
    result = json.loads(path.read_text())
    assert result["suite"] == "decode --peers" and result["machine"]["ctranslate2"]
    rows = {(r["search"], r["engine"]): r for r in result["results"]}
    engines = ("ours (jax float32)", "ctranslate2 float32", "ctranslate2 int8")
    assert set(rows) == {(s, e) for s in ("greedy", "beam4") for e in engines}
    for (search, engine), row in rows.items():
        assert row["tokens_per_sec"] == pytest.approx(row["tokens"] / row["s"])
        peer = rows[search, "ctranslate2 float32"]
        assert row["ratio"] == pytest.approx(row["tokens_per_sec"] / peer["tokens_per_sec"])
        assert row["sentences"] == 8 and row["tokens"] > 0
    assert rows["greedy", "ctranslate2 float32"]["same"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["model", "--peers"], "--peers is for the decode suite"),
    (["decode", "--workdir=runs/default"], "--workdir is for decode --peers"),
    (["decode", "--peers", "--workdir=TMP"], "--workdir=TMP has no checkpoints (a training "
                                             "run's --workdir)"),
    (["decode", "--peers", "--quick", "--workdir=TMP"], "--workdir is not read with --quick"),
])
def test_peers_and_their_workdir_are_for_the_decode_suite(args, message, tmp_path, capsys):
    """Refused before anything runs; a --workdir named but not trained is not skipped."""
    with pytest.raises(SystemExit) as exit_info:
        main([a.replace("TMP", str(tmp_path)) for a in args])
    assert exit_info.value.code == 2
    assert message.replace("TMP", str(tmp_path)) in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["model", "--vary", "dropout_bits=4"], "dropout_bits must be one of 8, 16, 32, got 4"),
    (["model", "--vary", "pre_layer_norm=yes"], "pre_layer_norm= takes true or false"),
    (["model", "--vary", "d_model=wide"], "d_model= takes int values, got 'wide'"),
    (["model", "--vary", "dtype=bfloat16"], "a ModelConfig field other than dtype (--dtypes)"),
    (["decode", "--dtypes=float32,bf16"], "--dtypes takes float32, bfloat16, float16, got 'bf16'"),
    (["compare", "--dtypes=float32"], "--dtypes is for the attention, model and decode suites"),
    (["pipeline", "--vary", "dropout_bits=8"], "--vary is for the model and decode suites"),
    (["decode", "--searches=greedy,beam"], "--searches: a search is greedy or beamK"),
    (["decode", "--searches=beam1"], "with a beam size K of 2 or more (beam4), got 'beam1'"),
    (["model", "--searches=greedy"], "--searches is for the decode suite"),
    (["decode", "--peers", "--searches=greedy"], "--searches is not for decode --peers"),
    (["attention", "--models=base"], "--models, --loss-chunks and --strategies are for the"),
    (["decode", "--loss-chunks=0"], "--models, --loss-chunks and --strategies are for the"),
    (["decode", "--strategies=pmap"], "--models, --loss-chunks and --strategies are for the"),
    (["model", "--strategies=pmap,jit"], "--strategies takes pmap, sharded, got 'jit'"),
    (["model", "--strategies=pmap,"], "--strategies='pmap,' holds an empty name"),
    (["attention", "--vary", "xla_gpu_enable_cublaslt=true"],
     "--vary is for the model and decode suites"),
    (["decode", "--peers", "--vary", "xla_gpu_enable_cublaslt=true"],
     "--vary is not for decode --peers, which times one search of its own"),
    (["decode", "--peers", "--dtypes=float32"], "--dtypes is not for decode --peers"),
    (["model", "--models=tiny,"], "--models='tiny,' holds an empty name; give names separated "
                                  "by commas"),
    (["model", "--models="], "--models='' holds an empty name"),
    (["decode", "--dtypes="], "--dtypes takes float32, bfloat16, float16, got ''"),
    (["decode", "--searches="], "--searches='' holds an empty name"),
    (["pipeline", "--profile=/tmp/unused"], "--profile traces compiled calls; the pipeline "
                                            "suite times the input pipeline on the host"),
    (["decode", "--quick", "--vary", "attention_implementation=auto,fast"],
     "tiny with {'attention_implementation': 'fast'}: ModelConfig.attention_implementation "
     "must be one of"),
    (["model", "--loss-chunks=0,-4"], "--loss-chunks takes integers 0 or more"),
    (["model", "--loss-chunks=whole"], "--loss-chunks takes integers 0 or more"),
    (["model", "--models=bse,tiny"], "no model bse here; this backend times tiny"),
    (["model", "--models=tiny, bse"], "error: no model bse here"),  # spaces as --dtypes takes
    (["model", "--quick", "--models=base"], "no model base here; this backend times tiny with "
                                            "--quick"),
    (["model", "--vary", "dropout_bits=8", "--vary", "dropout_bits=16"], "given twice"),
    (["model", "--quick", "--vary", "dropout_bits=8", "--vary", "dropout_rate=0.001"],
     "tiny with {'dropout_bits': 8, 'dropout_rate': 0.001}: ModelConfig.dropout_rate 0.001"),
    (["model", "--vary", "xla_gpu_enable_cublasltt=true"],
     "xla_gpu_enable_cublasltt=true: XLA refuses it: INVALID_ARGUMENT: No such compile option"),
    (["model", "--vary", "xla_gpu_enable_cublaslt=1"], "'1' is not a valid bool value"),
    (["model", "--vary", "xla_gpu_autotune_level=high"], "'high' is not a valid int32 value"),
])
def test_model_suite_options_are_checked_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_the_model_suite_refuses_a_device_count_that_does_not_split_its_rows(monkeypatch,
                                                                              capsys):
    """3 devices and the tiny case's 8 rows: one usage error naming both and what to do,
    before anything compiles (it was parallel.py's traceback after the state was drawn);
    the compare suite times one device, as its peer, on any count."""
    monkeypatch.setattr(jax, "local_device_count", lambda: 3)
    with pytest.raises(SystemExit):
        main(["model", "--quick"])
    assert ("error: the model suite splits its rows over this process's 3 devices, and the "
            "rows of tiny (8) do not split so; time on a count that divides them") in (
        capsys.readouterr().err)
    parse_args(["compare", "--quick"])


def test_an_mfu_is_over_the_peak_of_every_device_that_shares_the_step(monkeypatch):
    """4 accelerators of 100 TFLOP/s each: a step's MFU is over 400; a CPU's peak, the
    host's measured matmul rate, is shared by its simulated devices and stays as it is."""
    assert machine.summed_peak(100.0, 4) == 100.0  # this backend: the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert machine.summed_peak(100.0, 4) == 400.0 and machine.summed_peak(None, 4) is None


def test_xla_options_in_vary_take_the_type_xla_gives_them(tmp_path):
    """XLA refuses "true" for a bool and 1 for a float: each value gets the type its option
    has, and text stays text."""
    vary = model_suite.parse_vary([
        "xla_gpu_enable_cublaslt=false, true", "xla_gpu_autotune_level=0,4",
        "xla_gpu_autotune_gemm_rtol=1,0.5", f"xla_dump_to={tmp_path}", "dropout_bits=8,16"])
    assert vary == {"xla_gpu_enable_cublaslt": (False, True), "xla_gpu_autotune_level": (0, 4),
                    "xla_gpu_autotune_gemm_rtol": (1.0, 0.5), "xla_dump_to": (str(tmp_path),),
                    "dropout_bits": (8, 16)}
    assert [type(v) for v in vary["xla_gpu_autotune_gemm_rtol"]] == [float, float]


def test_jax_options_in_vary_take_their_types_and_leave_jax_as_it_was():
    """`--vary jax_...`: each value of the type of the option in force, checked by setting it
    and setting it back; an option JAX does not have, a value not of its type and one JAX
    refuses, each a ValueError in one line."""
    vary = model_suite.parse_vary(["jax_threefry_gpu_kernel_lowering=false, true",
                                   "jax_default_matmul_precision=highest,bfloat16"])
    assert vary == {"jax_threefry_gpu_kernel_lowering": (False, True),
                    "jax_default_matmul_precision": ("highest", "bfloat16")}
    assert jax.config.jax_threefry_gpu_kernel_lowering is False
    assert jax.config.jax_default_matmul_precision == "highest"  # conftest's, set back
    assert model_suite.split_fields({"dropout_bits": 8, "xla_gpu_autotune_level": 0,
                                     "jax_threefry_partitionable": False}) == (
        {"dropout_bits": 8}, {"xla_gpu_autotune_level": 0}, {"jax_threefry_partitionable": False})
    for text, message in [("jax_no_such_option=1", r"jax_no_such_option: JAX has no such"),
                          ("jax_threefry_partitionable=yes", r"takes true or false, got 'yes'"),
                          ("jax_default_matmul_precision=fastest",
                           r"=fastest: JAX refuses it: new enum value must be None or in")]:
        with pytest.raises(ValueError, match=message):
            model_suite.parse_vary([text])
    assert jax.config.jax_default_matmul_precision == "highest"


def test_a_jax_option_in_vary_draws_the_state_and_compiles_the_step_and_is_set_back(
        monkeypatch):
    """`--vary jax_threefry_partitionable=false`: the row's parameters are drawn under it
    (threefry's other layout of the bits gives other parameters), its step compiled and
    timed under it, the row names it, and JAX's own setting is back after the row."""
    case = next(c for c in model_suite.cases(quick=True) if c.name == "tiny")
    seen, drawn = [], []
    real_fresh_state, real_timed_seconds = model_suite.fresh_state, model_suite.timed_seconds

    def fresh_state(parallel, *args):  # the parameters kept before the step donates them
        state, seconds = real_fresh_state(parallel, *args)
        drawn.append(parallel.get_state(state).params)
        return state, seconds

    def compile_spy(*args, **kwargs):
        seen.append(("compile", jax.config.jax_threefry_partitionable))
        return compile_seconds(*args, **kwargs)

    def timed_spy(run_once, **kwargs):
        seen.append(("timed", jax.config.jax_threefry_partitionable))
        return real_timed_seconds(run_once, **kwargs)

    monkeypatch.setattr(model_suite, "fresh_state", fresh_state)
    monkeypatch.setattr(model_suite, "compile_seconds", compile_spy)
    monkeypatch.setattr(model_suite, "timed_seconds", timed_spy)
    row = model_suite.time_train_step(case, "float32", "sharded", quick=True,
                                      fields={"jax_threefry_partitionable": False})
    assert row["jax_threefry_partitionable"] is False and row["state_s"] > 0
    assert seen == [("compile", False), ("timed", False)]
    assert jax.config.jax_threefry_partitionable is True
    draw = jax.jit(functools.partial(init_params, Transformer(case.config)))  # as the trainer
    with model_suite.jax_options({"jax_threefry_partitionable": False}):
        expected = draw(jax.random.key(0))
    as_usual = draw(jax.random.key(0))
    leaves = jax.tree.leaves(drawn[0])
    assert len(drawn) == 1
    assert all(np.array_equal(a, b) for a, b in zip(leaves, jax.tree.leaves(expected)))
    assert not all(np.array_equal(a, b) for a, b in zip(leaves, jax.tree.leaves(as_usual)))


def test_alternated_steps_take_turns_each_on_its_own_state(monkeypatch):
    """One step of each in turn per round, each on the state its last step left, the
    warm-up rounds untimed; each step's seconds are its own (steps of 2 and 5 s on a faked
    clock)."""
    now, calls = [0.0], []
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def step(label, seconds):
        def run(state, batch):
            calls.append((label, state, batch))
            now[0] += seconds
            return state + 1, {"loss_sum": jnp.zeros(())}
        return run

    runs = {"a": [step("a", 2.0), 10, "A"], "b": [step("b", 5.0), 20, "B"]}
    assert alternated_steps(runs, 3, warmup=1) == {"a": [2.0, 2.0], "b": [5.0, 5.0]}
    assert calls == [("a", 10, "A"), ("b", 20, "B"), ("a", 11, "A"), ("b", 21, "B"),
                     ("a", 12, "A"), ("b", 22, "B")]
    assert [runs["a"][1], runs["b"][1]] == [13, 23]


def test_each_row_compiles_the_parameters_program_afresh(caplog):
    """`state_s` is a fresh train.py's: the parameters' program compiled for each row, where
    `create_train_state` alone keeps it for the next state of the same model."""
    case = next(c for c in model_suite.cases(quick=True) if c.name == "tiny")
    model, parallel = Transformer(case.config), Parallel("sharded")
    tx = make_optimizer(d_model=case.config.d_model).tx

    def compilations(build) -> int:
        caplog.clear()
        with jax.log_compiles(), caplog.at_level("WARNING", logger="jax._src.dispatch"):
            build()
            build()
        return sum("XLA compilation of jit(_compiled_init_params)" in record.getMessage()
                   for record in caplog.records)

    assert compilations(lambda: create_train_state(model, tx, jax.random.key(0))) <= 1
    assert compilations(lambda: model_suite.fresh_state(parallel, model, tx)) == 2
    state, seconds = model_suite.fresh_state(parallel, model, tx)
    assert seconds > 0 and int(parallel.get_state(state).step) == 0


def test_values_that_hold_commas_are_separated_by_semicolons():
    """XLA's command buffer option is a list: `;` separates the values where one has a
    comma, and each is checked whole."""
    vary = model_suite.parse_vary(["xla_gpu_enable_command_buffer=;FUSION,CUBLAS;FUSION"])
    assert vary == {"xla_gpu_enable_command_buffer": ("", "FUSION,CUBLAS", "FUSION")}
    # One list alone ends with a semicolon; nothing after the = is the empty list.
    for text, values in [("FUSION,CUBLAS;", ("FUSION,CUBLAS",)), ("", ("",))]:
        assert model_suite.parse_vary([f"xla_gpu_enable_command_buffer={text}"]) == {
            "xla_gpu_enable_command_buffer": values}
    with pytest.raises(ValueError, match="'fusion' is not a valid enum value"):
        model_suite.parse_vary(["xla_gpu_enable_command_buffer=FUSION;fusion,CUBLAS"])



@pytest.mark.parametrize("strategy", ["pmap", "sharded"])
def test_an_xla_option_in_vary_reaches_the_compiled_step(strategy, tmp_path):
    """`--vary xla_dump_to=DIR`: the row's step is compiled with the option under either
    strategy (XLA writes the step's program, with its "optimizer" scope, into DIR, on any
    backend), and the row names the option."""
    case = next(c for c in model_suite.cases(quick=True) if c.name == "tiny")
    option = {"xla_dump_to": str(tmp_path)}
    row = model_suite.time_train_step(case, "float32", strategy, quick=True, fields=option)
    assert row["xla_dump_to"] == str(tmp_path) and row["step_ms"] > 0
    programs = [path.read_text() for path in tmp_path.glob("*.before_optimizations.txt")]
    step_scope = re.compile(r'op_name="([^"]*/)?optimizer/')  # pmap's names start there
    assert any(step_scope.search(program) for program in programs), os.listdir(tmp_path)


def test_a_gpu_option_varied_on_another_backend_is_noted_as_changing_nothing():
    """`--vary xla_gpu_...` on a CPU: XLA takes the option and compiles the same program,
    so its rows differ by noise (6.55 and 9.49 ms in one --quick run on 2 cores); a note
    says so."""
    from transformer_jax.benchmark.__main__ import _inert_options

    notes = _inert_options({"xla_gpu_enable_cublaslt": (True, False), "dropout_bits": (8,)})
    backend = jax.default_backend()
    assert notes == ([] if backend == "gpu" else [
        f"xla_gpu_enable_cublaslt: XLA's GPU backend's, not this {backend} backend's: each "
        f"value compiles the same program, and their rows differ by noise"])
    assert _inert_options({}) == [] and _inert_options({"dropout_bits": (8, 16)}) == []


def test_the_attention_grid_refuses_what_it_cannot_time_before_timing():
    """From a notebook, `attention.run(**overrides)`: an unknown key, float64 (float32 under
    JAX's default, timed under float64's name), and sizes of 0 (a ZeroDivisionError deep in
    the suite), each one ValueError naming the key."""
    for overrides, message in [
            ({"implementations": ("xla",)}, r"^unknown attention grid keys \['implementations'\]"),
            ({"dtypes": ("float64",)}, r"^dtypes must be among \('float32', 'bfloat16', "
                                       r"'float16'\), got \['float64'\]$"),
            ({"head_dims": (0,)}, r"^head_dims must be positive integers, got \(0,\)$"),
            ({"seq_lens": (16, 0)}, r"^seq_lens must be positive integers, got \(16, 0\)$"),
            ({"tokens": 0}, r"^tokens must be a positive integer, got 0$")]:
        with pytest.raises(ValueError, match=message):
            attention_suite.run(quick=True, **overrides)
    # NumPy sizes (a sweep over np.arange) are timed and written to JSON as Python ints.
    rows, _ = attention_suite.run(quick=True, seq_lens=(np.int64(8),), head_dims=(np.int64(8),),
                                  num_heads=np.int64(1), tokens=np.int64(8), dtypes=("float32",),
                                  causal=(False,), models={})
    assert rows and all(type(row["seq_len"]) is int for row in rows)
    json.dumps(rows)


def test_a_tokamax_layer_norm_that_cannot_run_stops_the_model_suite_first(monkeypatch, capsys):
    """--vary layer_norm_implementation=...,tokamax without tokamax: one clear line before
    the other variants are timed."""
    monkeypatch.setitem(sys.modules, "tokamax", None)  # as where it is not installed
    with pytest.raises(SystemExit):
        main(["model", "--quick", "--vary", "layer_norm_implementation=xla,tokamax"])
    assert "'tokamax' needs tokamax (pip install tokamax" in capsys.readouterr().err


def test_output_files_are_checked_before_anything_runs(tmp_path, capsys):
    """--json and --plot in a folder that cannot be made or written (/proc, even to root),
    naming a folder, empty, or both naming one file; a --profile folder that is a file or
    holds an earlier run's traces: each stops the command before the suite runs, with one
    line. A missing folder is made; a path through a missing folder (x/..) or a link is
    resolved to the file it names."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "timed-000").mkdir()
    for argv, message in [
            (["attention", f"--json={blocker}/x.json"],
             f"--json's folder {blocker} is a file, not a folder"),
            (["attention", f"--plot={blocker}/x.png"],
             f"--plot's folder {blocker} is a file, not a folder"),
            (["attention", "--json=/proc/x.json"],
             "--json's folder /proc is not a writable folder: a file cannot be made there ("),
            (["attention", f"--json={tmp_path}"], f"--json={tmp_path} is a folder; give a "
                                                  f"file name"),
            (["attention", "--json="], "--json is empty (an unset shell variable?); name a file"),
            (["attention", f"--json={tmp_path}/r.png", f"--plot={tmp_path}/r.png"],
             f"--json and --plot name one file, {tmp_path}/r.png; give each its own"),
            (["model", f"--profile={blocker}"],
             f"error: --profile {blocker} is a file, not a folder"),
            (["model", f"--profile={blocker}/traces"],
             f"error: --profile {blocker}/traces is not a writable folder"),
            (["model", f"--profile={tmp_path / 'used'}"],
             f"error: --profile {tmp_path / 'used'} is not empty; give a new folder")]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err.splitlines()[-1]
    args = parse_args(["attention", f"--json={tmp_path}/new/deeper/x.json"])
    assert args.json == f"{tmp_path}/new/deeper/x.json" and (tmp_path / "new" / "deeper").is_dir()
    args = parse_args(["attention", f"--json={tmp_path}/missing/../y.json"])
    assert args.json == f"{tmp_path}/y.json"
    (tmp_path / "link.json").symlink_to(tmp_path / "new" / "z.json")
    assert parse_args(["attention", f"--json={tmp_path}/link.json"]).json == \
        f"{tmp_path}/new/z.json"


def test_plot_without_matplotlib_stops_before_the_suite(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    with pytest.raises(SystemExit) as exit_info:
        main(["loss", "--quick", f"--plot={tmp_path}/l.png"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --plot needs matplotlib: pip install 'transformer_jax[bench]'")


def test_a_reader_that_goes_away_stops_no_file_and_ctrl_c_is_one_line(tmp_path):
    """`| head -1`: stdout's reader leaves after the first line; the suite still runs and
    writes its --json, with no BrokenPipeError. Ctrl-C while a suite runs: "error:
    interrupted", death by SIGINT, no --json (no row was measured yet)."""
    command = [sys.executable, "-m", "transformer_jax.benchmark", "loss", "--quick"]
    process = subprocess.Popen([*command, f"--json={tmp_path}/l.json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("loss on ")
    process.stdout.close()
    stderr = process.communicate(timeout=300)[1]
    assert process.returncode == 0 and "Error" not in stderr, stderr
    assert json.loads((tmp_path / "l.json").read_text())["results"]
    # The model suite compiles for seconds after its first line: the signal comes before
    # it ends.
    process = subprocess.Popen([sys.executable, "-m", "transformer_jax.benchmark", "model",
                                "--quick", f"--json={tmp_path}/i.json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("model on ")  # JAX imported; the suite runs
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == -signal.SIGINT
    assert stderr.strip().splitlines()[-1] == "error: interrupted", stderr
    assert "Traceback" not in stderr and not (tmp_path / "i.json").exists()


def test_a_stopped_suite_keeps_the_rows_it_measured(tmp_path, monkeypatch, capsys):
    """A suite stopped part-way (Ctrl-C, a timeout's SIGTERM, a case that fails) leaves
    --json holding the rows measured before the stop, marked incomplete; a run to the end
    writes the whole report over it."""
    from transformer_jax.benchmark import loss as loss_suite

    time_method, calls = loss_suite.time_method, []

    def stopped_at_the_third(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return time_method(*args, **kwargs)

    monkeypatch.setattr(loss_suite, "time_method", stopped_at_the_third)
    path = tmp_path / "loss.json"
    with pytest.raises(KeyboardInterrupt):
        main(["loss", "--quick", f"--json={path}"])
    kept = json.loads(path.read_text())
    assert kept["complete"] is False and kept["notes"] == [] and kept["suite"] == "loss"
    assert [row["method"] for row in kept["results"]] == ["whole", "chunks"]
    assert all(row["ms"] > 0 and row["rows"] == 64 for row in kept["results"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        f'{path} keeps the 2 rows measured before the stop ("complete": false)')
    monkeypatch.setattr(loss_suite, "time_method", time_method)
    assert main(["loss", "--quick", f"--json={path}"]) == 0
    whole = json.loads(path.read_text())
    assert whole["complete"] is True and len(whole["results"]) >= 4 and whole["notes"]


def _earlier_run(path, suite="model", complete=True):
    """A --json file as a run writes it: two rows, a note, the machine it ran on."""
    rows = [{"model": "tiny", "dtype": "float32", "step_ms": 2.5, "tokens_per_sec": 1024.0},
            {"model": "small", "dtype": "float32", "step_ms": 10.0, "tokens_per_sec": 256.0}]
    earlier = report.document(suite, rows, quick=True, notes=["step_ms: a note"], argv=[],
                              complete=complete)
    earlier["machine"].update(device_kind="NVIDIA H200", device_count=1, backend="gpu")
    report.write_json(str(path), earlier)
    return earlier


def test_from_json_prints_and_draws_an_earlier_run_and_times_nothing(tmp_path, capsys,
                                                                    monkeypatch):
    """The rows and notes of the file, as the run printed them, under the machine and date
    that measured them; --plot draws them; no suite runs."""
    from transformer_jax.benchmark import __main__ as command

    monkeypatch.setattr(command, "_run_suite", lambda args: pytest.fail("a suite ran"))
    earlier = _earlier_run(tmp_path / "model.json")
    png = tmp_path / "model.png"
    assert main(["model", f"--from-json={tmp_path}/model.json", "--markdown",
                 f"--plot={png}"]) == 0
    head, *rest = capsys.readouterr().out.splitlines()
    assert head.startswith(f"model as measured {earlier['date']} on 1x NVIDIA H200 (gpu, ")
    assert "[quick]" in head and "stopped" not in head
    assert "\n".join(rest) == (report.markdown(earlier["results"]) + "\n  step_ms: a note"
                               + f"\nwrote {png}")
    assert "| small | float32 | 10 | 256 |" in rest
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _earlier_run(tmp_path / "stopped.json", complete=False)
    main(["model", f"--from-json={tmp_path}/stopped.json"])
    assert 'stopped part-way: "complete": false' in capsys.readouterr().out.splitlines()[0]


def test_from_json_shows_files_of_older_runs_and_decode_peers(tmp_path, capsys):
    """A file from before the report had "complete" and "argv", or one without its machine
    and date (written by hand); a `decode --peers` file, shown with --peers."""
    earlier = _earlier_run(tmp_path / "model.json")
    old = {key: earlier[key] for key in ("suite", "quick", "date", "machine", "results")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    bare = {"suite": "model", "results": earlier["results"]}
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    png = tmp_path / "bare.png"
    assert main(["model", f"--from-json={tmp_path}/old.json"]) == 0
    assert main(["model", f"--from-json={tmp_path}/bare.json", f"--plot={png}"]) == 0
    shown = capsys.readouterr().out.split("\nmodel as measured ")
    assert shown[0].startswith(f"model as measured {earlier['date']} on 1x NVIDIA H200 (")
    assert "stopped" not in shown[0] and report.table(earlier["results"]) in shown[0]
    assert shown[1].startswith("(no date) (no machine named)\n")
    assert report.table(earlier["results"]) in shown[1] and png.stat().st_size > 0
    _earlier_run(tmp_path / "peers.json", suite="decode --peers")
    assert main(["decode", "--peers", f"--from-json={tmp_path}/peers.json"]) == 0
    assert capsys.readouterr().out.startswith("decode --peers as measured ")


def test_from_json_starts_no_backend(tmp_path):
    """Showing a file never starts JAX's backend (on a GPU it would take 75 % of the memory
    beside a running job): here a backend that cannot start would end the command."""
    earlier = _earlier_run(tmp_path / "model.json")
    command = [sys.executable, "-m", "transformer_jax.benchmark", "model",
               f"--from-json={tmp_path}/model.json"]
    shown = subprocess.run(command, env={**os.environ, "JAX_PLATFORMS": "tpu"},
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert report.table(earlier["results"]) in shown.stdout


@pytest.mark.parametrize("argv, message", [
    (["decode", "--from-json=TMP/model.json"],
     "--from-json TMP/model.json holds the rows of 'model', not of 'decode'"),
    (["decode", "--peers", "--from-json=TMP/model.json"], "not of 'decode --peers'"),
    (["model", "--from-json=TMP/missing.json"], "--from-json TMP/missing.json: No such file"),
    (["model", "--from-json=TMP"], "--from-json TMP: Is a directory"),
    (["model", "--from-json=TMP/text.json"],
     "--from-json TMP/text.json is not a benchmark's --json file"),
    (["model", "--from-json=TMP/list.json"], "TMP/list.json is not a benchmark's --json file"),
    (["model", "--from-json=TMP/numbers.json"], "TMP/numbers.json is not a benchmark's"),
    (["model", "--from-json=TMP/text_notes.json"], "TMP/text_notes.json is not a benchmark's"),
    (["model", "--from-json=TMP/empty.json", "--plot=TMP/x.png"],
     "--plot: no row of TMP/empty.json has tokens_per_sec, the value it draws"),
    (["model", "--from-json=TMP/no_rate.json", "--plot=TMP/x.png"],
     "--plot: no row of TMP/no_rate.json has tokens_per_sec"),
    (["model", "--from-json=TMP/model.json", "--quick", "--vary", "dropout_bits=8"],
     "--quick, --vary: not read with --from-json, which times nothing"),
    (["model", "--from-json=TMP/model.json", "--json=TMP/again.json"],
     "--json: not read with --from-json"),
])
def test_from_json_refuses_what_it_cannot_show_in_one_line(argv, message, tmp_path, capsys):
    _earlier_run(tmp_path / "model.json")
    (tmp_path / "text.json").write_text("step_ms 2.5\n")
    (tmp_path / "list.json").write_text("[1, 2]\n")
    for name, fields in (("numbers", {"results": [1, 2]}), ("empty", {"results": []}),
                         ("text_notes", {"results": [], "notes": "a note"}),
                         ("no_rate", {"results": [{"model": "tiny", "step_ms": 2.5}]})):
        (tmp_path / f"{name}.json").write_text(json.dumps({"suite": "model", **fields}))
    with pytest.raises(SystemExit) as exit_info:
        main([arg.replace("TMP", str(tmp_path)) for arg in argv])
    assert exit_info.value.code == 2
    assert message.replace("TMP", str(tmp_path)) in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "x.png").exists()


def test_a_peer_failing_on_its_backward_pass_writes_neither_of_its_rows(tmp_path, monkeypatch):
    """The attention suite's mask rows: a peer whose forward pass was timed and whose
    forward + backward fails is skipped whole, in --json's rows so far as in the rows
    returned (its forward row was written alone, and then left out of the report)."""
    time_case = attention_suite.time_case

    def failing_backward(name, *, backward, **shape):
        if name == "peer" and backward:
            raise RuntimeError("no backward here")
        return time_case(name, backward=backward, **shape)

    monkeypatch.setattr(attention_suite, "time_case", failing_backward)
    monkeypatch.setattr(attention_suite, "PEERS", {"peer": (attention_suite.ours("xla"),
                                                            lambda mask: "")})
    path = tmp_path / "attention.json"
    with report.streaming(str(path), "attention", quick=True, argv=[]):
        rows, skipped = attention_suite.mask_case_rows(
            "tiny", "packed", True, "float32", attention_suite.grid(True), True)
    written = json.loads(path.read_text())["results"]
    assert [(row["implementation"], row["pass"]) for row in written] == [
        (row["implementation"], row["pass"]) for row in rows]
    assert {row["implementation"] for row in rows} == {"auto", "reference", "xla"}
    assert "peer at float32, tiny, packed: failed, RuntimeError: no backward here" in skipped


def test_help_says_what_each_suite_times(capsys):
    from transformer_jax.benchmark import SUITES
    from transformer_jax.benchmark.__main__ import SUITE_HELP

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and list(SUITE_HELP) == list(SUITES)
    lines = capsys.readouterr().out.split("\nsuites:\n")[1].splitlines()
    assert [line.split()[0] for line in lines] == list(SUITES)
    assert all(len(line) <= 100 for line in lines)


def test_a_suites_bars_draw_every_row_with_its_headline_figure():
    """compare's train-step and attention rows share TFLOP/s, so each gets a bar (its
    attention rows had no tokens/s and were left out); values 100 x apart and more are
    drawn on a log scale (grain's packers beside ours), the others on a linear one."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from transformer_jax.benchmark.plot import HEADLINE, bar_figure

    compare = [dict(framework="ours", tokens_per_sec=9.0, tflops=0.5),
               dict(framework="torch", tokens_per_sec=6.0, tflops=0.3),
               dict(framework="ours attention", length=16, tflops=0.6),
               dict(framework="flax attention", length=16, tflops=0.4)]
    figure = bar_figure(compare, HEADLINE["compare"], "compare")
    (axes,) = figure.axes
    assert [bar.get_width() for bar in axes.patches] == [0.5, 0.3, 0.6, 0.4]
    assert axes.get_xscale() == "linear" and axes.get_xlabel() == "TFLOP/s"
    plt.close(figure)
    pipeline = [dict(packer="ours", examples_per_sec=400_000.0),
                dict(packer="grain", examples_per_sec=761.0)]
    figure = bar_figure(pipeline, HEADLINE["pipeline"], "pipeline")
    assert figure.axes[0].get_xscale() == "log"
    assert figure.axes[0].get_xlabel() == "examples/s (log scale)"
    plt.close(figure)


def test_bars_are_labelled_by_the_settings_that_tell_rows_apart():
    """Rows differing only in an int (loss_chunk, unroll) get bars of their own; the settings
    all rows share go to the title; a byte count is a measure, not a setting; rows of equal
    settings (a case timed again) are numbered."""
    from transformer_jax.benchmark.plot import row_labels

    rows = [dict(model="tiny", strategy="pmap", loss_chunk=0, step_ms=2.0, memory_bytes=9),
            dict(model="tiny", strategy="pmap", loss_chunk=64, step_ms=3.0, memory_bytes=8),
            dict(model="tiny", strategy="sharded", loss_chunk=0, step_ms=2.5, memory_bytes=7),
            dict(model="tiny", strategy="sharded", loss_chunk=0, step_ms=2.6, memory_bytes=7)]
    assert row_labels(rows) == (["pmap loss_chunk=0", "pmap loss_chunk=64",
                                 "sharded loss_chunk=0 #1", "sharded loss_chunk=0 #2"],
                                "model=tiny")
    # How many calls were timed, or how many tokens a search wrote, is measured too.
    peers = [dict(search="greedy", engine="ours", sentences=300, tokens=7461, timed=5, s=1.0),
             dict(search="greedy", engine="ctranslate2", sentences=300, tokens=7460, timed=3,
                  s=2.0)]
    assert row_labels(peers) == (["ours", "ctranslate2"], "search=greedy, sentences=300")


def test_cli_writes_a_png_and_rejects_bad_arguments(tmp_path):
    png = tmp_path / "attention.png"
    done = subprocess.run([sys.executable, "-m", "transformer_jax.benchmark", "pipeline",
                           "--quick", f"--plot={png}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad in (["nonsense"], ["model", "--plot=out.jpg"]):
        done = subprocess.run([sys.executable, "-m", "transformer_jax.benchmark", *bad],
                              capture_output=True, text=True)
        assert done.returncode == 2 and "error:" in done.stderr


def test_attention_flops_by_hand_and_by_xla():
    # 4·B·N·T·S·H = 4·2·3·5·7·11 = 9240; causal half; backward 3.5x.
    assert flops.attention_flops(2, 5, 7, 3, 11) == 9240
    # XLA's count of eq. 1's two matmuls, Q Kᵀ and (weights) V, compiled on the CPU.
    cpu = jax.devices("cpu")[0]
    q_BTNH, k_BSNH = (jax.device_put(jnp.ones(shape), cpu) for shape in ((2, 5, 3, 11),
                                                                         (2, 7, 3, 11)))
    w_BNTS = jax.device_put(jnp.ones((2, 3, 5, 7)), cpu)
    xla = sum(jax.jit(lambda a, b, spec=spec: jnp.einsum(spec, a, b)).lower(x, y).compile()
              .cost_analysis()["flops"]
              for spec, x, y in (("BTNH,BSNH->BNTS", q_BTNH, k_BSNH),
                                 ("BNTS,BSNH->BTNH", w_BNTS, k_BSNH)))
    assert xla == 9240
    assert flops.attention_flops(2, 5, 7, 3, 11, causal=True) == 4620
    assert flops.attention_flops(2, 5, 7, 3, 11, backward=True) == 9240 * 3.5


def test_forward_flops_match_xla_cost_analysis():
    """Our matmul count against XLA's own count of the compiled forward pass."""
    config = get_model_config("tiny", vocab_size=503, d_model=64, d_ff=256, num_layers=2)
    batch, source_len, target_len = 3, 13, 11
    model = Transformer(config)
    # XLA's CPU count on every machine: a GPU's fused kernels count their FLOPs otherwise.
    cpu = jax.devices("cpu")[0]
    inputs = jax.device_put(jnp.ones((batch, source_len), jnp.int32), cpu)
    targets = jax.device_put(jnp.ones((batch, target_len), jnp.int32), cpu)
    params = jax.device_put(model.init(jax.random.key(0), inputs, targets), cpu)
    compiled = jax.jit(model.apply).lower(params, inputs, targets).compile()
    xla = compiled.cost_analysis()["flops"]
    ours = flops.forward_flops(config, batch, source_len, target_len)
    # XLA also counts softmax, layer norms, biases and adds: a few percent more.
    assert ours <= xla <= 1.15 * ours


def test_flops_without_attention_drop_exactly_the_three_attentions():
    """What `attention=False` leaves out is eq. 1 in each layer: encoder self-attention
    (S × S), decoder self-attention (T × T, the full square) and cross-attention (T × S)."""
    config = get_model_config("base")
    b, s, t, n, h = 4, 30, 20, config.num_heads, config.d_model // config.num_heads
    per_layer = (flops.attention_flops(b, s, s, n, h) + flops.attention_flops(b, t, t, n, h)
                 + flops.attention_flops(b, t, s, n, h))
    gap = (flops.train_step_flops(config, b, s, t)
           - flops.train_step_flops(config, b, s, t, attention=False))
    assert gap == 3 * config.num_layers * per_layer


def test_peak_table_lookup():
    assert machine.table_peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.0
    assert machine.table_peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
    assert machine.table_peak_tflops("NVIDIA H200", "float32") == 494.5
    assert machine.table_peak_tflops("NVIDIA H100 NVL", "bfloat16") == 835.0
    assert machine.table_peak_tflops("NVIDIA H200 NVL", "float32") == 417.5
    assert machine.table_peak_tflops("TPU v5 lite", "float32") is None
    assert machine.table_peak_tflops("TPU v5 lite", "bfloat16") == 197.0
    assert machine.table_peak_tflops("TPU v5", "bfloat16") == 459.0  # v5p
    assert machine.table_peak_tflops("Some Other GPU", "bfloat16") is None


def test_uncached_callback_gives_the_cached_logits():
    """The uncached baseline computes what the cache computes, step by step."""
    config = model_configs()["tiny"]
    model = Transformer(config)
    inputs = jnp.asarray(synthetic_batch(config, 3, 7, seed=1)["inputs"])
    variables = model.init(jax.random.key(1), inputs, inputs)
    memory = model.apply(variables, inputs, method=Transformer.encode)
    steps = [make(model, variables, memory, inputs, 6)
             for make in (decode._cached_callback, decode._uncached_callback)]
    ids = [jnp.zeros((3, 1), jnp.int32)] + [jnp.full((3, 1), t, jnp.int32) for t in (5, 9, 7)]
    states = [cache for _, cache in steps]
    for ids_R1 in ids:
        logits = []
        for i, (step, _) in enumerate(steps):
            out, states[i] = step(ids_R1, states[i])
            logits.append(np.asarray(out))
        np.testing.assert_allclose(logits[0], logits[1], atol=1e-5, rtol=1e-5)
        assert (logits[0][:, :2] == np.finfo(np.float32).min).all()  # PAD and EOS never win


def test_search_runs_to_the_full_length():
    config = model_configs()["tiny"]
    model = Transformer(config)
    inputs = jnp.asarray(synthetic_batch(config, 2, 5)["inputs"])
    params = model.init(jax.random.key(0), inputs, inputs)["params"]
    for cached in (True, False):
        out = decode.search(params, inputs, model=model, beam_size=2, max_length=6, cached=cached)
        assert out.shape == (2, 6) and (np.asarray(out) > 1).all()


def test_torch_peer_is_the_same_model():
    """Same parameter count, but for the final encoder and decoder LayerNorms torch adds."""
    pytest.importorskip("torch", reason="the bench extra is not installed")
    from transformer_jax.benchmark import torch_peer

    config = get_model_config("tiny", vocab_size=97)
    peer = torch_peer.build(config, length=5)
    peer_total = sum(p.numel() for p in peer.parameters())
    assert peer_total == count_parameters(config)["total"] + 2 * 2 * config.d_model


def test_pipeline_counts():
    """Examples from the target segments; tokens are the non-padding positions per side,
    under our keys and under grain's packers' keys; slots the rows' sizes. Padded batches:
    one example per row that has target ids."""
    segments = {"inputs": np.array([[1, 1, 2, 2, 2, 0], [1, 1, 0, 0, 0, 0]]),
                "targets": np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 0, 0, 0]])}
    for suffix in ("_segmentation", "_segment_ids"):
        batch = {key + suffix: value for key, value in segments.items()}
        assert _counts(batch, suffix) == (3, 7, 8, 12, 12)
    padded = {"inputs": np.array([[5, 9, 1, 0], [7, 1, 0, 0], [0, 0, 0, 0]]),
              "targets": np.array([[4, 1, 0], [8, 8, 1], [0, 0, 0]])}
    assert _counts(padded) == (2, 5, 5, 12, 9)


def test_table_aligns_every_key():
    """Floats to 3 digits or whole with separators, large ints (a byte count) with them."""
    text = report.table([{"a": 1.23456, "b": "x", "n": 151666744},
                         {"a": 12345.6, "c": None, "n": 4096}])
    lines = text.splitlines()
    assert lines[0].split() == ["a", "b", "n", "c"]
    assert lines[2].split() == ["1.23", "x", "151,666,744", "-"]
    assert lines[3].split() == ["12,346", "-", "4096", "-"]
    assert len({len(line) for line in lines}) == 1


def test_large_ints_take_separators_from_ten_thousand_and_floats_from_a_thousand():
    """A byte count of 10,000 or more, and any float that rounds to 1,000 or more, with
    separators; a smaller int as it is, a smaller float to 3 significant digits."""
    assert [report.format_value(n) for n in (9999, 10_000, -10_000)] == [
        "9999", "10,000", "-10,000"]
    assert [report.format_value(x) for x in (999.4, 999.7, 1000.0, -1234.5, 0.5, 0.004)] == [
        "999", "1,000", "1,000", "-1,234", "0.5", "4.00e-03"]


def test_rows_sharing_few_columns_are_tables_of_their_own():
    """A row sharing fewer than half of its and a table's columns starts a table (the
    pipeline's preparation after its rates); one sharing half or more joins the latest such
    table, though another came between (compare's torch.compile row after the attention
    rows)."""
    rates = [{"data": "d", "stage": "pack", "rate": 1.0, "fill": 0.5},
             {"data": "d", "stage": "bucket", "rate": 2.0, "fill": 0.25, "resume_s": 3.0}]
    prepared = {"data": "d", "stage": "prepare", "pairs": 7, "prepare_s": 4.0, "threads": 2}
    text = report.table([*rates, prepared, {"data": "e", "stage": "prepare", "pairs": 8}])
    first, second = (block.splitlines() for block in text.split("\n\n"))
    assert first[0].split() == ["data", "stage", "rate", "fill", "resume_s"]
    assert [line.split() for line in first[2:]] == [["d", "pack", "1", "0.5", "-"],
                                                    ["d", "bucket", "2", "0.25", "3"]]
    assert second[0].split() == ["data", "stage", "pairs", "prepare_s", "threads"]
    assert [line.split() for line in second[2:]] == [["d", "prepare", "7", "4", "2"],
                                                     ["e", "prepare", "8", "-", "-"]]
    assert len({len(line) for line in first}) == 1 and len({len(line) for line in second}) == 1
    late = {"data": "f", "stage": "pack", "rate": 3.0, "fill": 0.75}
    tables = report.markdown([*rates, prepared, late]).split("\n\n")
    assert [table.splitlines() for table in tables] == [
        ["| data | stage | rate | fill | resume_s |", "|---|---|---|---|---|",
         "| d | pack | 1 | 0.5 | - |", "| d | bucket | 2 | 0.25 | 3 |",
         "| f | pack | 3 | 0.75 | - |"],
        ["| data | stage | pairs | prepare_s | threads |", "|---|---|---|---|---|",
         "| d | prepare | 7 | 4 | 2 |"]]


def test_profile_counts_only_the_timed_calls(tmp_path):
    """A traced matmul shows up once per timed call (warm-up calls are not traced), and the
    CPU peak's own 10 timed matmuls not at all (they were 64-78 % of a --quick suite's
    profile)."""
    from transformer_jax import profiling
    from transformer_jax.benchmark import machine, timing

    a = jnp.ones((256, 256))
    matmul = jax.jit(lambda x: x @ x).lower(a).compile()
    timing.trace_timed_calls(str(tmp_path))
    try:
        timing.median_seconds(lambda: matmul(a).block_until_ready(), warmup=2, iters=4)
        machine.cpu_matmul_tflops.__wrapped__(128)  # measured afresh, not from the cache
    finally:
        timing.trace_timed_calls(None)
    rows = profiling.summarize(str(tmp_path))
    assert rows and all(row["ms"] > 0 for row in rows)
    assert sum(row["share"] for row in rows) == pytest.approx(1.0)
    if jax.default_backend() == "cpu":
        assert [row["calls"] for row in rows if row["operation"] in ("dot", "ynn_fusion")] == [4]
    else:  # the GPU's kernels: the matmul's, once per timed call
        assert max(row["calls"] for row in rows) == 4


def test_timed_seconds_gives_the_median_and_the_spread_of_the_timed_calls(monkeypatch):
    """On a fake clock each call takes its scripted seconds: the 2 warm-up calls are not
    counted; the 3 timed ones give the median, fastest, slowest, and a row's columns."""
    from transformer_jax.benchmark import timing

    now, durations = [0.0], iter([50.0, 40.0, 1.0, 3.0, 2.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def run_once():
        now[0] += next(durations)

    timed = timing.timed_seconds(run_once, warmup=2, iters=3, budget_s=1e9)
    assert timed == timing.Seconds(median=2.0, fastest=1.0, slowest=3.0, calls=3)
    assert timed.columns() == {"timed": 3, "spread": 1.0}


def test_each_timed_call_keeps_its_own_trace(tmp_path):
    """Two timed programs within one second: the profiler names its folders by the second,
    so each call traces into its own folder, and the summary counts both."""
    from transformer_jax import profiling
    from transformer_jax.benchmark import timing

    a = jnp.ones((64, 64))
    sine = jax.jit(jnp.sin).lower(a).compile()
    cosine_plus_one = jax.jit(lambda x: jnp.cos(x) + 1).lower(a).compile()
    timing.trace_timed_calls(str(tmp_path))
    try:
        for program in (sine, cosine_plus_one):
            timing.median_seconds(lambda: program(a).block_until_ready(), warmup=1, iters=3)
    finally:
        timing.trace_timed_calls(None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timed-000", "timed-001"]
    calls = sum(row["calls"] for row in profiling.summarize(str(tmp_path), top=None))
    assert calls >= 6  # three calls of each, at least one operation per call


def test_a_trace_named_with_a_path_stays_one_folder_deep(tmp_path):
    """An XLA option's path in a case's name (`--vary xla_dump_to=/tmp/x`) does not nest
    its trace: the folder is one level under the trace directory, where `--profile` looks
    for each program (`DIR/*/program.txt`)."""
    from transformer_jax import profiling
    from transformer_jax.benchmark import timing

    compiled = jax.jit(lambda x: x + 1).lower(jnp.ones(2)).compile()
    timing.trace_timed_calls(str(tmp_path))
    try:
        with timing.traced_as("tiny-xla_dump_to=/tmp/x", compiled):
            pass
    finally:
        timing.trace_timed_calls(None)
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/*")] == [
        f"tiny-xla_dump_to=_tmp_x/{profiling.PROGRAM_FILE}"]


def test_profile_notes_an_xla_option_that_replaces_its_own(tmp_path, capsys):
    """--profile compiles without command buffers (`profiling.TRACEABLE`); a --vary of that
    option replaces it, and the command says so before it runs (and only then)."""
    parse_args(["model", "--quick", f"--profile={tmp_path}",
                "--vary", "xla_gpu_enable_command_buffer=FUSION;"])
    assert "note: --vary xla_gpu_enable_command_buffer replaces what --profile compiles" in \
        capsys.readouterr().err
    parse_args(["model", "--quick", f"--profile={tmp_path}", "--vary", "dropout_bits=8"])
    parse_args(["model", "--quick", "--vary", "xla_gpu_enable_command_buffer=FUSION;"])
    assert "note:" not in capsys.readouterr().err


def test_packed_batch_is_packed_as_the_pipeline_packs():
    """Segments numbered 1, 2, ... then padding; positions restart at each example; ids are
    zero exactly on padding; at most 95 % of each row is used."""
    from transformer_jax.benchmark.model import packed_batch

    config = model_configs()["tiny"]
    batch = packed_batch(config, 4, 128, seed=3)
    segments, positions = batch["targets_segmentation"], batch["targets_positions"]
    for row_segments, row_positions in zip(segments, positions):
        used = row_segments[row_segments > 0]
        assert 0 < used.size <= int(128 * 0.95) and (row_segments[used.size:] == 0).all()
        ids, sizes = np.unique(used, return_counts=True)
        assert (ids == np.arange(1, ids.size + 1)).all() and (sizes >= 5).all()
        expected = np.concatenate([np.arange(size) for size in sizes])
        assert (row_positions[:used.size] == expected).all()
    for key in ("inputs", "targets"):
        assert ((batch[key] != 0) == (segments != 0)).all()


def test_auto_is_compared_with_the_fastest_other_implementation_of_its_shape():
    from transformer_jax.benchmark.attention import compare_auto

    shape = {"pass": "forward", "dtype": "bfloat16", "causal": False, "num_heads": 2,
             "head_dim": 64}
    rows = [{"implementation": name, "seq_len": t, "ms": ms, **shape} for name, t, ms in (
        ("auto", 128, 2.0), ("cudnn", 128, 3.0), ("xla", 128, 1.0), ("reference", 128, 1.5),
        ("auto", 256, 4.0), ("cudnn", 256, 4.0), ("auto", 512, 1.0))]
    assert compare_auto(rows) == 0.5
    assert [row.get("vs_fastest") for row in rows] == [0.5, None, None, None, 1.0, None, None]
    assert [row.get("fastest") for row in rows] == ["xla", None, None, None, "cudnn", None, None]


def test_back_to_back_queues_calls_and_waits_for_the_last():
    from transformer_jax.benchmark.timing import back_to_back

    calls = []
    back_to_back(lambda: calls.append(jnp.ones(2)) or calls[-1], 7)()
    assert len(calls) == 7


def test_pipeline_adds_workers_on_hosts_of_many_cores(monkeypatch):
    """The default run's batch at 0-2 workers everywhere; the GPU step's batch on the WMT-like
    corpus at 0-2 workers, and up to 16 where there are cores for them."""
    from transformer_jax.benchmark import pipeline

    def workers(data, cores):
        monkeypatch.setattr(pipeline.os, "cpu_count", lambda: cores)
        chosen = [case for case in pipeline.cases(False) if case.data == data]
        sizes = {(case.rows, case.source_length, case.target_length) for case in chosen
                 if not case.tokens}
        assert sizes == ({(64, 16, 32)} if data == "numbers" else {(96, 256, 256)})
        budgets = [(case.tokens, case.workers) for case in chosen if case.tokens]
        assert budgets == ([(64 * 32, 0)] if data == "numbers" else [(25_000, 0), (25_000, 2)])
        return [case.workers for case in chosen if not case.tokens]

    assert workers("wmt", 16) == [0, 1, 2, 4, 8, 16]
    assert workers("wmt", 12) == [0, 1, 2, 4, 8]
    assert workers("wmt", 2) == workers("numbers", 16) == workers("numbers", 2) == [0, 1, 2]
    assert [case.workers for case in pipeline.cases(True)] == [0, 0, 0, 0]


def test_pipeline_corpus_has_wmt_like_lengths_and_is_deterministic(tmp_path):
    """Aligned files of 20,000 lines: source words 25 ± 12 (log-normal), each target ≈ 1.05 ×
    its own source, Zipf word frequencies; the same seed writes the same bytes."""
    from transformer_jax.benchmark.corpus import write_wmt_like_corpus

    write_wmt_like_corpus(str(tmp_path / "a"), 20_000, seed=3)
    lines = {lang: (tmp_path / "a" / f"train.{lang}").read_text().split("\n")
             for lang in ("en", "de")}
    assert all(len(side) == 20_001 and side[-1] == "" for side in lines.values())
    words = {lang: [line.split(" ") for line in side[:-1]] for lang, side in lines.items()}
    en = np.array([len(w) for w in words["en"]])
    de = np.array([len(w) for w in words["de"]])
    assert 24.5 < en.mean() < 25.5 and 11.3 < en.std() < 12.7 and 1 <= en.min()
    assert 1.03 < np.median(de / en) < 1.07 and np.corrcoef(en, de)[0, 1] > 0.9
    _, counts = np.unique(np.concatenate([np.array(w) for w in words["en"]]),
                          return_counts=True)
    counts = np.sort(counts)[::-1]
    assert 0.12 < counts[:10].sum() / counts.sum() < 0.16  # ln(12.7 / 2.7) / ln(2e5 / 2.7)
    assert all(word.isalpha() and word.islower() for word in words["de"][0])
    assert len((tmp_path / "a" / "test.de").read_text().splitlines()) == 1000
    write_wmt_like_corpus(str(tmp_path / "b"), 20_000, seed=3)
    write_wmt_like_corpus(str(tmp_path / "c"), 20_000, seed=4)
    same = (tmp_path / "b" / "train.de").read_bytes() == (tmp_path / "a" / "train.de").read_bytes()
    other = (tmp_path / "c" / "train.de").read_bytes() != (tmp_path / "a" / "train.de").read_bytes()
    assert same and other


def test_corpus_command_writes_the_corpus_and_refuses_a_folder_that_has_one(tmp_path, capsys):
    """`python -m transformer_jax.benchmark.corpus DIR --pairs=N --seed=S` writes the files
    of write_wmt_like_corpus(DIR, N, seed=S), byte for byte; a second run into DIR stops."""
    from transformer_jax.benchmark.corpus import main, write_wmt_like_corpus

    main([str(tmp_path / "cli"), "--pairs=500", "--seed=2"])
    write_wmt_like_corpus(str(tmp_path / "library"), 500, seed=2)
    for name in ("train.en", "train.de", "validation.en", "test.de"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "library" / name).read_bytes()
    assert "wrote 500 training pairs" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "cli"), "--pairs=500"])
    assert "already holds a corpus" in capsys.readouterr().err


def test_a_stopped_corpus_leaves_no_short_file_and_is_written_again(tmp_path, monkeypatch,
                                                                     capsys):
    """Ctrl-C while validation is written: train.* are whole, validation.* not there, no
    temporary left; the same command then writes the whole corpus (only test.en, written
    last, marks a folder as done)."""
    from transformer_jax.benchmark import corpus

    real, calls = corpus.sentence_lengths, []

    def stopped_at_the_second_split(rng, pairs):
        calls.append(pairs)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(rng, pairs)

    monkeypatch.setattr(corpus, "sentence_lengths", stopped_at_the_second_split)
    with pytest.raises(KeyboardInterrupt):
        corpus.main([str(tmp_path / "cli"), "--pairs=300"])
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == ["train.de", "train.en"]
    monkeypatch.setattr(corpus, "sentence_lengths", real)
    corpus.main([str(tmp_path / "cli"), "--pairs=300"])
    corpus.write_wmt_like_corpus(str(tmp_path / "library"), 300)
    for name in ("train.en", "validation.de", "test.en", "test.de"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "library" / name).read_bytes()
    assert "wrote 300 training pairs" in capsys.readouterr().out


def loss_inputs(rows=40, width=16, vocab=50):
    rng = np.random.default_rng(1)
    return (jnp.asarray(rng.normal(size=(rows, width)), jnp.float32),
            jnp.asarray(rng.normal(size=(vocab, width)), jnp.float32),
            jnp.asarray(rng.integers(1, vocab, rows), jnp.int32))


def test_loss_suite_methods_compute_the_same_loss_and_gradients():
    """The suite's whole, chunked (chunks of 16 here) and two-pass methods give the same
    smoothed loss, accuracy and gradients, so the suite times the same work three ways."""
    from transformer_jax.benchmark import loss

    found, _ = loss.methods(chunk=16)
    x_RD, table_VD, targets_R = loss_inputs()
    results = {name: jax.value_and_grad(lambda x, t: found[name](x, t, targets_R, jnp.float32),
                                        argnums=(0, 1), has_aux=True)(x_RD, table_VD)
               for name in ("whole", "chunks", "2 passes")}
    (whole, whole_correct), whole_grads = results.pop("whole")
    for name, ((value, correct), grads) in results.items():
        np.testing.assert_allclose(value, whole, rtol=1e-5, err_msg=name)
        assert correct == whole_correct
        for a, b in zip(grads, whole_grads):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=name)


def test_loss_suite_optax_is_the_smoothed_loss_of_its_own_target():
    """The suite's optax method smooths with α/V on every token: §5.4's q (1 - ε on the
    target, ε/(V - 1) elsewhere) at ε = α(V - 1)/V, less q's entropy, which ours subtracts
    (`losses.label_smoothed_cross_entropy`); its accuracy is the same argmax count."""
    from transformer_jax.benchmark import loss
    from transformer_jax.losses import label_smoothed_cross_entropy, smoothed_target

    found, _ = loss.methods(chunk=16)
    x_RD, table_VD, targets_R = loss_inputs()
    vocab = table_VD.shape[0]
    eps = 0.1 * (vocab - 1) / vocab
    value, correct = found["optax"](x_RD, table_VD, targets_R, jnp.float32)
    ours, _ = label_smoothed_cross_entropy(x_RD @ table_VD.T, targets_R, label_smoothing=eps)
    entropy = smoothed_target(eps, vocab)[2]
    np.testing.assert_allclose(value, ours + targets_R.size * entropy, rtol=1e-5)
    assert correct == found["whole"](x_RD, table_VD, targets_R, jnp.float32)[1]


def test_loss_suite_tokamax_is_the_unsmoothed_loss():
    """tokamax's kernels, as the suite calls them (its default and, where it has it,
    chunked_xla), are the cross-entropy without smoothing: Σ -log softmax(x · table^T)[target],
    here against NumPy in float64."""
    pytest.importorskip("tokamax", reason="tokamax is optional (pip install tokamax)")
    from transformer_jax.benchmark import loss

    found, _ = loss.methods(chunk=16)
    x_RD, table_VD, targets_R = loss_inputs()
    logits = np.asarray(x_RD, np.float64) @ np.asarray(table_VD, np.float64).T
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    expected = -logp[np.arange(40), np.asarray(targets_R)].sum()
    kernels = [name for name in found if name.startswith("tokamax")]
    assert "tokamax" in kernels
    for name in kernels:
        value, _ = found[name](x_RD, table_VD, targets_R, jnp.float32)
        np.testing.assert_allclose(value, expected, rtol=1e-5, err_msg=name)


def test_decode_cases_of_one_model_share_parameters_its_dtypes_would_draw_alike():
    """The suite draws a model's parameters once for all its cases: what a bfloat16 model
    would draw from the same key is the same float32 tree, value for value."""
    shared = decode._params(model_configs()["tiny"])
    assert decode._params(model_configs()["tiny"]) is shared
    half = Transformer(dataclasses.replace(model_configs()["tiny"], dtype="bfloat16"))
    drawn = jax.jit(lambda key: init_params(half, key))(jax.random.key(0))  # as it was drawn
    assert jax.tree.structure(drawn) == jax.tree.structure(shared)
    jax.tree.map(np.testing.assert_array_equal, drawn, shared)
    assert {leaf.dtype for leaf in jax.tree.leaves(shared)} == {np.dtype(np.float32)}


def test_the_decode_suite_times_each_search_once_per_variant_and_bfloat16_cast_two_ways(
        monkeypatch):
    """`decode --vary`: every search of the suite once per combination of values, one after
    another; on an accelerator's bfloat16 each cached search again with its matrices cast by
    the model at every step, with the ratios on the default rows (`time_search` faked: the
    grid alone)."""
    calls = []

    def fake(name, batch, source_len, max_length, *, beam_size, cached, quick, dtype,
             fields, unroll=UNROLL, cast_once=True):
        calls.append(fields)
        seconds = 1.0 + 0.5 * (not cached) + 0.25 * (unroll == 1) + 0.125 * (not cast_once)
        return {"search": "greedy" if beam_size == 1 else f"beam{beam_size}",
                "cache": "cached" if cached else "uncached", "dtype": dtype,
                "unroll": 1 if beam_size == 1 else unroll,
                "cast": "once" if cast_once else "each step", **fields,
                "tokens_per_sec": 1 / seconds}

    monkeypatch.setattr(decode, "time_search", fake)
    monkeypatch.setattr(decode, "default_dtypes", lambda quick: ("float32", "bfloat16"))
    vary = {"attention_bias": (True, False), "xla_cpu_use_fusion_emitters": (False,)}
    rows, notes = decode.run(quick=True, vary=vary)
    searches = [("greedy", "cached", 1, "once"), ("greedy", "uncached", 1, "once"),
                ("beam4", "cached", UNROLL, "once"), ("beam4", "uncached", UNROLL, "once"),
                ("beam4", "cached", 1, "once")]
    each = {"greedy": ("greedy", "cached", 1, "each step"),
            "beam4": ("beam4", "cached", UNROLL, "each step")}
    expected = []
    for dtype in ("float32", "bfloat16"):
        for search in ("greedy", "beam4"):
            for bias in (True, False):
                group = [s for s in searches if s[0] == search]
                expected += [(dtype, bias, *s) for s in group
                             + ([each[search]] if dtype == "bfloat16" else [])]
    assert [(r["dtype"], r["attention_bias"], r["search"], r["cache"], r["unroll"], r["cast"])
            for r in rows] == expected
    assert all(fields == {"attention_bias": fields["attention_bias"],
                          "xla_cpu_use_fusion_emitters": False} for fields in calls)
    default = [r for r in rows if r["cache"] == "cached" and r["cast"] == "once"
               and r["unroll"] == (1 if r["search"] == "greedy" else UNROLL)]
    assert {r["speedup"] for r in default} == {1.5}
    assert {r["vs_unroll_1"] for r in default if r["search"] == "beam4"} == {1.25}
    assert [r.get("vs_cast_each_step") for r in default] == [None] * 4 + [1.125] * 4
    assert any("vs_cast_each_step" in note for note in notes)
    assert any("vs_unroll_1" in note for note in notes)
    # Greedy search alone in float32: no vs_unroll_1 or vs_cast_each_step column, and no
    # note explaining one.
    rows, notes = decode.run(quick=True, dtypes=("float32",), searches=("greedy",))
    assert not any(column in row for row in rows for column in ("vs_unroll_1",
                                                                 "vs_cast_each_step"))
    assert not any("vs_unroll_1" in note or "vs_cast_each_step" in note for note in notes)


def test_dtypes_searches_and_strategies_choose_what_the_suites_time(monkeypatch, tmp_path):
    """`decode --dtypes=bfloat16 --searches=beam8`: that search alone, with its comparisons
    (uncached, one step per iteration, cast at each step), in bfloat16 alone, beam size 8;
    `model --dtypes=float16,float32` times those dtypes in that order, and
    `--strategies=sharded,pmap` those strategies (both suites' timing faked: the grid
    alone); `attention --dtypes=bfloat16` that dtype alone."""
    searches = []

    def fake_search(name, batch, source_len, max_length, *, beam_size, cached, quick, dtype,
                    fields, unroll=UNROLL, cast_once=True):
        searches.append((dtype, beam_size, cached, unroll, cast_once))
        return {"search": f"beam{beam_size}", "tokens_per_sec": 1.0}

    monkeypatch.setattr(decode, "time_search", fake_search)
    assert main(["decode", "--quick", "--dtypes=bfloat16", "--searches=beam8"]) == 0
    assert searches == [("bfloat16", 8, True, UNROLL, True), ("bfloat16", 8, False, UNROLL, True),
                        ("bfloat16", 8, True, 1, True), ("bfloat16", 8, True, UNROLL, False)]
    steps = []
    monkeypatch.setattr(model_suite, "time_train_step", lambda case, dtype, strategy, **kw: (
        steps.append(dtype) or {"model": case.name, "dtype": dtype, "step_ms": 1.0}))
    assert main(["model", "--quick", "--dtypes=float16,float32", "--loss-chunks=0"]) == 0
    strategies = len(model_suite.default_strategies())
    assert steps == ["float16"] * strategies + ["float32"] * strategies
    monkeypatch.setattr(model_suite, "time_train_step", lambda case, dtype, strategy, **kw: (
        steps.append(strategy) or {"model": case.name, "dtype": dtype, "strategy": strategy,
                                   "step_ms": 1.0}))
    steps.clear()
    assert main(["model", "--quick", "--strategies=sharded,pmap", "--loss-chunks=0"]) == 0
    assert steps == ["sharded", "pmap"]
    # attention --dtypes=bfloat16: the grid's dtypes replaced, nothing else (run is faked;
    # tests/test_attention.py and notebook 03 run the grid with overrides)
    grids = []
    monkeypatch.setattr(attention_suite, "run", lambda quick, **overrides: (
        grids.append(overrides) or ([{"dtype": "bfloat16", "ms": 1.0}], [])))
    assert main(["attention", "--quick", "--dtypes=bfloat16"]) == 0
    assert main(["attention", "--quick"]) == 0
    assert grids == [{"dtypes": ("bfloat16",)}, {}]


def test_a_decode_search_is_built_and_compiled_with_its_fields(monkeypatch):
    """`time_search` with `fields`: the model built with its `ModelConfig` fields (its
    parameters drawn for them, in float32), the search compiled with its XLA options, the
    matrices cast at each step where asked, and all of them columns of the row."""
    drawn, options = [], []

    def spy(jitted, *args, compiler_options=None, **static):
        options.append((compiler_options, static["cast_once"],
                        jax.config.jax_threefry_partitionable))
        return compile_seconds(jitted, *args, compiler_options=compiler_options, **static)

    monkeypatch.setattr(decode, "compile_seconds", spy)
    monkeypatch.setattr(decode, "_params", lambda config: drawn.append(config) or init_params(
        Transformer(config), jax.random.key(0)))
    fields = {"attention_bias": False, "xla_cpu_use_fusion_emitters": False,
              "jax_threefry_partitionable": False}
    row = decode.time_search("tiny", 2, 8, 8, beam_size=1, cached=True, quick=True,
                             dtype="bfloat16", cast_once=False, fields=fields)
    assert [(config.attention_bias, config.dtype) for config in drawn] == [(False, "float32")]
    # JAX's option in force while the search compiled, and set back after the row.
    assert options == [({"xla_cpu_use_fusion_emitters": False}, False, False)]
    assert jax.config.jax_threefry_partitionable is True
    assert {key: row[key] for key in (*fields, "cast", "dtype")} == {
        **fields, "cast": "each step", "dtype": "bfloat16"}
    assert row["tokens_per_sec"] > 0


def test_json_to_a_pipe_is_one_document_and_the_pipe_stays(tmp_path):
    """--json=/dev/stdout or a named pipe: the rows measured are not streamed into it (a
    reader would get a document per row), and the whole report is written straight to it
    once. Before, each write went to a temporary file renamed over the path: the pipe was
    replaced by a regular file, and its reader got nothing (as root, /dev/stdout too)."""
    import stat
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    with report.streaming(str(fifo), "attention", quick=True, argv=["attention"]):
        report.measured({"implementation": "xla", "ms": 1.0})
        report.measured({"implementation": "reference", "ms": 2.0})
    whole = report.document("attention", [{"implementation": "xla", "ms": 1.0}], quick=True,
                            notes=["a note"], argv=["attention"])
    report.write_json(str(fifo), whole)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert len(got) == 1 and json.loads(got[0]) == whole


def matmul_flops(jaxpr) -> int:
    """2 × the output's size × the contracted size of every dot_general in `jaxpr` and in
    the jaxprs of its equations, a scan's body once per iteration: the matmul FLOPs of a
    traced program, counted independently of flops.py's formulas."""
    from jax.extend.core import jaxprs_in_params

    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracted, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
                lhs[i] for i in contracted)
        repeat = eqn.params["length"] if eqn.primitive.name == "scan" else 1
        total += repeat * sum(map(matmul_flops, jaxprs_in_params(eqn.params)))
    return total


def test_flops_are_the_matmuls_of_the_traced_forward_pass_and_train_step():
    """Every matmul of the traced programs counted (no compilation): the forward pass over
    S source and T ≠ S target tokens is `forward_flops` exactly, and the whole train step
    (forward, backward, Adam) `train_step_flops`; a tiny config by hand too. XLA's count
    beside them has a 15 % margin, in which a term such as the cross-attention's K and V
    over T tokens instead of S, or the tied output layer counted twice, went unseen."""
    from transformer_jax.steps import train_step

    # D 4, F 8, V 10, one layer, S 2, T 3: encoder 2 · (8·16 + 4·4·8 + 4·2·4) = 576;
    # decoder 3 · (8·16 + 4·3·4 + 4·16 + 4·2·4 + 4·4·8) + 2 · 4·16 = 1328; output 3 · 2·4·10.
    hand = get_model_config("tiny", vocab_size=10, d_model=4, d_ff=8, num_heads=2, num_layers=1)
    assert flops.forward_flops(hand, 1, 2, 3) == 576 + 1328 + 240
    assert flops.train_step_flops(hand, 1, 2, 3) == 3 * (576 + 1328 + 240)
    # Without attention: less the encoder's 2 · 4·2·4 and the decoder's 3 · (4·3·4 + 4·2·4).
    assert flops.forward_flops(hand, 1, 2, 3, attention=False) == 2144 - 64 - 240

    config = get_model_config("tiny", vocab_size=503, d_model=64, d_ff=256, num_layers=2)
    batch, source_len, target_len = 3, 13, 7
    model = Transformer(config)
    inputs = jnp.ones((batch, source_len), jnp.int32)
    targets = jnp.ones((batch, target_len), jnp.int32)
    params = model.init(jax.random.key(0), inputs, targets)
    forward = jax.make_jaxpr(model.apply)(params, inputs, targets).jaxpr
    assert matmul_flops(forward) == flops.forward_flops(config, batch, source_len, target_len)
    optimizer = make_optimizer(d_model=config.d_model)
    state = create_train_state(model, optimizer.tx, jax.random.key(0))
    step = functools.partial(train_step, model=model, seed=0, label_smoothing=0.1,
                             learning_rate_fn=optimizer.learning_rate_fn)
    rows = {"inputs": inputs + 4, "targets": targets + 4}
    traced = jax.make_jaxpr(step)(state, rows).jaxpr
    assert matmul_flops(traced) == flops.train_step_flops(config, batch, source_len, target_len)


def test_a_train_step_rows_figures_are_its_flops_and_tokens_over_its_time(monkeypatch):
    """time_train_step's arithmetic on a faked clock: a timed run queues `queued_steps` steps
    (4 here, as an accelerator queues 5), so a step is a quarter of the median; tokens/s
    count every target position, real ones the non-padding targets of packed rows; MFU is
    `train_step_flops` per second over the peak of the row's dtype times its devices (the
    rows split over 2 of them here), and mfu_no_attention the same without attention's."""
    monkeypatch.setattr(model_suite, "queued_steps", lambda quick: 4)
    monkeypatch.setattr(model_suite, "timed_seconds",
                        lambda run_once, **timing_args: timing.Seconds(2.0, 1.0, 3.0, 3))
    peaks = {"float32": 0.004, "float16": 0.016}  # TFLOP/s, the float32 one never used
    monkeypatch.setattr(model_suite, "peak_tflops",
                        lambda dtype, quick=False: (peaks[dtype], "faked"))
    summed = []
    monkeypatch.setattr(model_suite, "summed_peak",
                        lambda peak, devices: summed.append(devices) or peak * devices)
    tiny = model_configs()["tiny"]
    case = model_suite.Case("tiny", tiny, 4, 64)
    row = model_suite.time_train_step(case, "float16", "sharded", quick=True, packed=True,
                                      devices=jax.devices()[:2])
    seconds, work = 0.5, flops.train_step_flops(tiny, 4, 64, 64)
    matmuls = flops.train_step_flops(tiny, 4, 64, 64, attention=False)
    real = np.count_nonzero(model_suite.packed_batch(tiny, 4, 64)["targets"])
    assert 0 < real < 4 * 64 and summed == [2]
    assert (row["devices"], row["rows"], row["timed"], row["spread"]) == (2, "packed", 3, 1.0)
    assert row["step_ms"] == pytest.approx(seconds * 1e3)
    assert row["tokens_per_sec"] == pytest.approx(4 * 64 / seconds)
    assert row["real_tokens_per_sec"] == pytest.approx(real / seconds)
    assert row["tflops"] == pytest.approx(work / seconds / 1e12)
    assert row["mfu"] == pytest.approx(work / seconds / 1e12 / (2 * 0.016))
    assert row["mfu_no_attention"] == pytest.approx(matmuls / seconds / 1e12 / (2 * 0.016))


def test_an_attention_rows_figures_are_eq1s_flops_over_one_calls_time(monkeypatch):
    """time_case's arithmetic on a faked clock: on an accelerator a timed run queues 10 calls,
    so a call is a tenth of the median; TFLOP/s are `attention_flops` of the row's shape as
    timed (causal: half the square; fwd+bwd: 3.5 × the forward), and the peak fraction is
    over the row's dtype's peak."""
    queued = []
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # read by time_case alone
    monkeypatch.setattr(attention_suite, "back_to_back",
                        lambda call, calls: queued.append(calls) or call)
    monkeypatch.setattr(attention_suite, "timed_seconds",
                        lambda run_once, **timing_args: timing.Seconds(0.02, 0.01, 0.03, 5))
    peaks = {"float32": 0.5, "bfloat16": 2.0}
    monkeypatch.setattr(attention_suite, "peak_tflops",
                        lambda dtype, quick=False: (peaks[dtype], "faked"))
    shape = dict(batch=2, seq_len=16, num_heads=2, head_dim=8)
    row = attention_suite.time_case("peer", attend=attention_suite.ours("reference"),
                                    dtype="bfloat16", causal=True, backward=True, quick=True,
                                    **shape)
    work = flops.attention_flops(2, 16, 16, 2, 8, causal=True, backward=True)
    assert work == 4 * 2 * 2 * 16 * 16 * 8 / 2 * 3.5 and queued == [10]
    assert (row["runs"], row["pass"], row["causal"], row["timed"]) == ("peer", "fwd+bwd", True, 5)
    assert row["ms"] == pytest.approx(2.0)
    assert row["tflops"] == pytest.approx(work / 0.002 / 1e12)
    assert (row["peak_tflops"], row["peak_fraction"]) == (2.0, pytest.approx(row["tflops"] / 2))


def test_compare_ratios_are_ours_over_the_peer_and_torchs_mfu_is_over_the_peak(monkeypatch):
    """Flax's attention rows: `ratio` on our row is our TFLOP/s over Flax's at the same
    length (timing faked: ours twice as fast). torch's step: its tokens/s, TFLOP/s of
    `train_step_flops` and MFU over the float32 peak, from its median time (faked)."""
    from transformer_jax.benchmark import compare

    def time_case(name, **shape):
        return {"batch": shape["batch"], "pass": "forward", "ms": 1.0,
                "tflops": 3.0 if name == "auto" else 1.5}

    monkeypatch.setattr(attention_suite, "time_case", time_case)
    rows = compare.flax_attention_rows(quick=True)
    assert [(row["framework"], row.get("ratio")) for row in rows] == [
        ("transformer_jax attention (auto)", 2.0), ("flax nn.dot_product_attention", None)] * 2
    pytest.importorskip("torch", reason="the compare suite's peer is PyTorch ('.[bench]')")
    monkeypatch.setattr(compare, "median_seconds", lambda step, **timing_args: 0.25)
    monkeypatch.setattr(compare, "peak_tflops", lambda dtype, quick=False: (
        {"float32": 0.5, "bfloat16": 2.0}[dtype], "faked"))
    monkeypatch.setattr(compare.torch_peer, "train_step_fn", lambda *args, **kwargs: None)
    (case,) = compare.train_cases(quick=True)
    row = compare.torch_row(case, quick=True)
    work = flops.train_step_flops(case.config, case.batch, case.length, case.length)
    assert row["tokens_per_sec"] == case.batch * case.length / 0.25 and row["step_ms"] == 250
    assert row["tflops"] == pytest.approx(work / 0.25 / 1e12)
    assert row["mfu"] == pytest.approx(row["tflops"] / 0.5)


def test_the_loss_suites_rows_are_6rdv_over_their_time_and_compared_with_the_whole(
        monkeypatch):
    """Each method's TFLOP/s are the nominal 6·R·D·V (the logits, then the gradients of the
    features and of the table) over its median (faked: 0.5, 0.25, 1 and 2 ms), and vs_whole
    is the whole logits' time over its own: 2 where it is twice as fast."""
    from transformer_jax.benchmark import loss

    monkeypatch.setitem(sys.modules, "tokamax", None)  # the four methods of every install
    medians = iter([0.5e-3, 0.25e-3, 1e-3, 2e-3])
    monkeypatch.setattr(loss, "timed_seconds", lambda run_once, **timing_args: timing.Seconds(
        (median := next(medians)), median, median, 3))
    rows, _ = loss.run(quick=True)
    (rows_, width, vocab, _, _), = loss.cases(quick=True)
    assert [row["method"] for row in rows] == ["whole", "chunks", "2 passes", "optax"]
    assert [row["ms"] for row in rows] == pytest.approx([0.5, 0.25, 1.0, 2.0])
    assert [row["tflops"] for row in rows] == pytest.approx(
        [6 * rows_ * width * vocab / seconds / 1e12 for seconds in (0.5e-3, 0.25e-3, 1e-3, 2e-3)])
    assert [row["vs_whole"] for row in rows] == pytest.approx([1.0, 2.0, 0.5, 0.25])


def test_a_searchs_rates_count_each_sentences_output_tokens_once(monkeypatch):
    """Beam search of 2 on 2 sentences for 8 tokens in 0.5 s (faked): 16 output tokens (the
    best hypothesis of each, not each beam's) and 2 sentences, so 32 tokens/s and 4
    sentences/s."""
    monkeypatch.setattr(decode, "timed_seconds",
                        lambda run_once, **timing_args: timing.Seconds(0.5, 0.5, 0.5, 3))
    row = decode.time_search("tiny", 2, 8, 8, beam_size=2, cached=True, quick=True)
    assert (row["search"], row["ms"], row["tokens_per_sec"], row["sentences_per_sec"]) == (
        "beam2", 500.0, 32.0, 4.0)


def test_pipeline_rates_count_the_timed_batches_alone(monkeypatch):
    """On a clock that each batch read moves 1 s: the 2 warm-up batches are read but not
    timed or counted; 3 batches of 2 rows of 4 source + 6 target slots (3 examples, 6
    source and 7 target tokens each) in 3 s; fill is each side's tokens over its slots."""
    from transformer_jax.benchmark import pipeline

    now = [0.0]
    batch = {"inputs_segmentation": np.array([[1, 1, 2, 0], [1, 1, 1, 0]]),
             "targets_segmentation": np.array([[1, 1, 1, 2, 2, 0], [1, 1, 0, 0, 0, 0]])}

    def batches():
        while True:
            now[0] += 1.0
            yield batch

    monkeypatch.setattr(pipeline, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    figures = pipeline.time_batches(batches(), 3, warmup=2)
    assert figures == pytest.approx({
        "batches_per_sec": 1.0, "examples_per_sec": 3 * 3 / 3, "tokens_per_sec": 3 * 13 / 3,
        "target_tokens_per_sec": 3 * 7 / 3, "source_fill": 6 / 8, "target_fill": 7 / 12})


def test_the_preparation_row_rates_each_way_of_preparing_over_its_own_seconds(monkeypatch,
                                                                               tmp_path):
    """prepare_wmt on a faked clock: the corpus written in 3 s, the tokenizer trained in 5,
    the ids prepared on sentencepiece's threads in 8, then in 4 worker processes (2 cores)
    in 2: pairs/s of each over its own seconds, and the processes 4 × the threads' rate."""
    from transformer_jax.benchmark import pipeline

    now, prepares = [0.0], iter([8.0, 2.0])

    def taking(seconds, result=None):
        def run(*args, **kwargs):
            now[0] += seconds
            return result
        return run

    def prepare_train(data, workdir, processes=None):
        os.makedirs(pipeline.prepared_dir(workdir), exist_ok=True)  # what is removed between
        taking(next(prepares))()

    monkeypatch.setattr(pipeline, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(pipeline, "write_wmt_like_corpus", taking(3.0, str(tmp_path)))
    monkeypatch.setattr(pipeline, "get_tokenizer", taking(5.0))
    monkeypatch.setattr(pipeline, "_prepare_train", prepare_train)
    monkeypatch.setattr(pipeline, "worker_processes", lambda pairs: 4)
    monkeypatch.setattr(pipeline, "usable_cores", lambda: 2)
    figures, _, _ = pipeline.prepare_wmt(1000, True, str(tmp_path))
    assert figures == {"pairs": 1000, "generate_s": 3.0, "tokenizer_s": 5.0, "prepare_s": 2.0,
                       "pairs_per_sec": 500.0, "pairs_per_sec_per_core": 250.0,
                       "processes": 4, "threads_prepare_s": 8.0, "threads_pairs_per_sec": 125.0,
                       "processes_over_threads": 4.0}


def test_timed_seconds_reports_the_median_and_times_slow_calls_at_least_three_times(
        monkeypatch):
    """The median of 1, 10 and 2 s is 2 (their mean would be 4.3); a call slower than the
    budget is still timed 3 times; the last warm-up call sets how many fit the budget (a
    first one of 50 s that compiles, then 5 s: 6 calls in 30 s)."""
    now, durations = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def run_once():
        now[0] += durations.pop(0)

    durations[:] = [50.0, 40.0, 1.0, 10.0, 2.0]
    assert timing.timed_seconds(run_once, warmup=2, iters=3, budget_s=1e9) == timing.Seconds(
        median=2.0, fastest=1.0, slowest=10.0, calls=3)
    durations[:] = [20.0] * 4
    assert timing.timed_seconds(run_once, warmup=1, iters=10, budget_s=30.0).calls == 3
    durations[:] = [50.0, 5.0] + [1.0] * 6
    assert timing.timed_seconds(run_once, warmup=2, iters=10, budget_s=30.0).calls == 6
    assert not durations


def test_planned_memory_is_arguments_outputs_and_temporaries_less_the_aliased():
    """An output that aliases an argument (a donated state) is one buffer, counted once."""
    stats = types.SimpleNamespace(argument_size_in_bytes=100, output_size_in_bytes=50,
                                  temp_size_in_bytes=30, alias_size_in_bytes=20)
    compiled = types.SimpleNamespace(memory_analysis=lambda: stats)
    assert timing.memory_bytes(compiled) == 160
    assert timing.memory_bytes(types.SimpleNamespace(memory_analysis=lambda: None)) is None


def test_the_peak_table_holds_the_dense_datasheet_figures():
    """Dense (no sparsity) bfloat16 peaks per chip; on NVIDIA GPUs float16 runs at the
    bfloat16 rate and float32 (TF32) at half of it; TPUs list no float32 peak."""
    assert {name: peaks["bfloat16"] for name, peaks in machine.PEAK_TFLOPS.items()} == {
        "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200 NVL": 835.0,
        "H200": 989.0, "A100": 312.0, "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5": 459.0,
        "TPU v6 lite": 918.0}
    for name, peaks in machine.PEAK_TFLOPS.items():
        if name.startswith("TPU"):
            assert set(peaks) == {"bfloat16"}, name
        else:
            assert peaks == {"bfloat16": peaks["bfloat16"], "float16": peaks["bfloat16"],
                             "float32": peaks["bfloat16"] / 2}, name


def test_a_cpus_peak_is_its_measured_matmul_rate(monkeypatch):
    """A size² float32 matmul is 2·size³ FLOPs over its median time (faked: 0.5 s); the
    suites measure 2048² (512² with --quick) and the note names that size."""
    monkeypatch.setattr(machine, "median_seconds", lambda run_once, **timing_args: 0.5)
    assert machine.cpu_matmul_tflops.__wrapped__(64) == 2 * 64**3 / 0.5 / 1e12
    if jax.default_backend() != "cpu":
        return
    monkeypatch.setattr(machine, "cpu_matmul_tflops", lambda size: size / 1e3)
    assert machine.peak_tflops("bfloat16", quick=True) == (0.512, "measured: 512x512 float32 "
                                                                   "matmul")
    assert machine.peak_tflops("float32") == (2.048, "measured: 2048x2048 float32 matmul")


def test_a_suites_bars_go_logarithmic_only_past_100_x():
    """Bars 50 × apart stay on a linear scale; past 100 × (grain's packers beside ours) a
    log scale shows the short ones."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from transformer_jax.benchmark.plot import bar_figure

    for ratio, scale in ((50.0, "linear"), (100.0, "linear"), (101.0, "log")):
        figure = bar_figure([dict(packer="ours", examples_per_sec=ratio),
                             dict(packer="grain", examples_per_sec=1.0)],
                            "examples_per_sec", "pipeline")
        assert figure.axes[0].get_xscale() == scale, ratio
        plt.close(figure)


def test_the_attention_figure_draws_tflops_against_length_and_the_peak():
    """One line per implementation and head dim, TFLOP/s by sequence length (rows given out
    of order), the dtype's peak as a dotted line; the rows at a model's shape are left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from transformer_jax.benchmark.plot import attention_figure

    common = {"dtype": "float32", "pass": "forward", "causal": False, "head_dim": 64,
              "peak_tflops": 0.5}
    rows = [{"implementation": name, "seq_len": t, "tflops": tflops, "ms": 1.0, **common}
            for name, t, tflops in (("xla", 64, 0.2), ("xla", 16, 0.1), ("reference", 16, 0.05),
                                    ("reference", 64, 0.15))]
    rows.append({"implementation": "xla", "seq_len": 32, "tflops": 9.0, "ms": 1.0,
                 "model": "tiny", **common})
    figure = attention_figure(rows)
    (axes,) = figure.axes
    lines = {line.get_label(): line.get_xydata().tolist() for line in axes.get_lines()}
    assert lines == {"reference H=64": [[16, 0.05], [64, 0.15]],
                     "xla H=64": [[16, 0.1], [64, 0.2]],
                     "peak 0.5 TFLOP/s": [[0, 0.5], [1, 0.5]]}
    plt.close(figure)
