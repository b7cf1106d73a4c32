"""Profiles: a trace's busy and idle time, and train.py's trace of its own steps."""

import gzip
import json
import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from run_configs import tiny_run
from transformer_jax import profiling
from transformer_jax.decoding import UNROLL
from transformer_jax.trainer import train


def write_trace(folder, events):
    """A trace file as JAX's profiler writes it (Chrome trace events, gzipped)."""
    os.makedirs(folder, exist_ok=True)
    with gzip.open(os.path.join(folder, "host.trace.json.gz"), "wt") as f:
        json.dump({"traceEvents": events}, f)


def op(name, start_us, duration_us, pid=1, tid=1):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": start_us, "dur": duration_us}


def test_timeline_counts_overlapping_operations_once(tmp_path):
    """Ops on two threads over [0, 10], [5, 20], [30, 40] (µs): a span of 40, busy for 30
    (the overlap counted once), idle 10; runtime spans are not operations."""
    write_trace(tmp_path, [op("dot.1", 0, 10), op("fusion.2", 5, 15, tid=2),
                           op("ThunkExecutor::Execute", -100, 500), op("fusion.3", 30, 10)])
    assert profiling.timeline(str(tmp_path)) == pytest.approx(
        {"span_ms": 0.040, "busy_ms": 0.030, "idle_ms": 0.010, "idle_share": 0.25})
    rows = profiling.summarize(str(tmp_path))
    assert [(r["operation"], r["calls"]) for r in rows] == [("fusion", 2), ("dot", 1)]
    assert [r["ms"] for r in rows] == pytest.approx([0.025, 0.010])


def test_a_cpu_trace_with_instruction_names_counts_only_the_instructions(tmp_path):
    """XLA's CPU operations carry args["hlo_op"] (jax 0.10's traces); the host thread's
    spans, such as the 1.35 s of "np.asarray(jax.Array)" in which train.py waited for a
    logged loss, do not, and were counted as operations: a summary of 3 steps added up to
    more than their wall time. Only the instructions count now."""
    def instruction(name, start_us, duration_us, tid=1):
        return dict(op(name, start_us, duration_us, tid=tid), args={"hlo_op": name})

    write_trace(tmp_path, [instruction("ynn_fusion.1", 0, 10),
                           instruction("copy_bitcast_fusion.2", 5, 15, tid=2),
                           op("np.asarray(jax.Array)", 20, 1000, tid=3),
                           op("ArrayImpl.copy_to_host_async", 20, 5, tid=3),
                           instruction("ynn_fusion.3", 1030, 10)])
    rows = profiling.summarize(str(tmp_path))
    assert [(r["operation"], r["calls"]) for r in rows] == [("ynn_fusion", 2),
                                                            ("copy_bitcast_fusion", 1)]
    assert profiling.timeline(str(tmp_path)) == pytest.approx(
        {"span_ms": 1.040, "busy_ms": 0.030, "idle_ms": 1.010, "idle_share": 1.010 / 1.040})


def test_timeline_of_a_gpu_counts_only_its_kernels(tmp_path):
    """With a GPU in the trace, only its kernels count: the host's ops are not device time."""
    gpu = {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}
    write_trace(tmp_path, [gpu, op("host_fusion", 0, 100), op("gemm_fusion_dot", 10, 20, pid=7),
                           op("loop_add_fusion", 50, 10, pid=7)])
    assert profiling.timeline(str(tmp_path)) == pytest.approx(
        {"span_ms": 0.050, "busy_ms": 0.030, "idle_ms": 0.020, "idle_share": 0.4})


def test_a_gpus_kernels_are_summed_by_name_without_their_number(tmp_path):
    """A GPU's kernels end in "_N", not ".N": "loop_add_fusion_3" and "loop_add_fusion_12"
    are one kind, called twice. A C++ template's kernel name, hundreds of characters long,
    is cut to its first 100 in the table."""
    gpu = {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}
    template = "void cutlass::Kernel<cutlass_80_tensorop_" + "s1688gemm_" * 20 + ">"
    write_trace(tmp_path, [gpu, op("loop_add_fusion_3", 0, 10, pid=7),
                           op("loop_add_fusion_12", 20, 30, pid=7),
                           op(template, 60, 5, pid=7)])
    rows = profiling.summarize(str(tmp_path))
    assert [(r["operation"], r["calls"]) for r in rows] == [("loop_add_fusion", 2),
                                                            (template[:100], 1)]
    assert [r["ms"] for r in rows] == pytest.approx([0.040, 0.005])


def test_a_trace_without_instruction_names_leaves_out_the_runtimes_spans(tmp_path):
    """Without args["hlo_op"], the runtime's spans are told by their names: "::" anywhere
    in one (not only at its start), or a space, which no XLA instruction's name holds."""
    write_trace(tmp_path, [op("fusion.1", 0, 10),
                           op("TfrtCpuExecutable::ExecuteHelper", -5, 100),
                           op("wait for the results", 10, 50, tid=2), op("fusion.2", 30, 10)])
    assert [(r["operation"], r["calls"]) for r in profiling.summarize(str(tmp_path))] == [
        ("fusion", 2)]
    assert profiling.timeline(str(tmp_path)) == pytest.approx(
        {"span_ms": 0.040, "busy_ms": 0.020, "idle_ms": 0.020, "idle_share": 0.5})


def test_summarize_keeps_the_top_operations_with_their_share_of_all(tmp_path):
    """16 kinds of operation, kind k taking k+1 µs (136 µs in all): the default keeps the
    15 largest; `top=2` the 2 largest, each with its share of all 136 µs, not of the
    2 shown."""
    write_trace(tmp_path, [op(f"kind{k}.1", 20 * k, k + 1) for k in range(16)])
    rows = profiling.summarize(str(tmp_path))
    assert [r["operation"] for r in rows] == [f"kind{k}" for k in range(15, 0, -1)]
    top = profiling.summarize(str(tmp_path), top=2)
    assert [(r["operation"], r["calls"]) for r in top] == [("kind15", 1), ("kind14", 1)]
    assert [r["share"] for r in top] == pytest.approx([16 / 136, 15 / 136])
    assert len(profiling.summarize(str(tmp_path), top=None)) == 16


def test_every_hosts_trace_file_counts(tmp_path):
    """A trace of two hosts is two files in two folders: both hosts' operations count."""
    write_trace(tmp_path / "host0", [op("fusion.1", 0, 10)])
    write_trace(tmp_path / "host1", [op("fusion.1", 5, 20), op("dot.2", 40, 10)])
    rows = profiling.summarize(str(tmp_path))
    assert [(r["operation"], r["calls"]) for r in rows] == [("fusion", 2), ("dot", 1)]
    assert profiling.timeline(str(tmp_path))["span_ms"] == pytest.approx(0.050)


def test_a_folder_without_a_trace_or_operations_is_an_error(tmp_path):
    """No trace file is a FileNotFoundError, not an empty summary; a trace without an
    operation a ValueError, which StepTrace reports as a ProfileError; a trace whose one
    operation took no time is idle for none of its span, not a division by zero."""
    with pytest.raises(FileNotFoundError, match="no \\*.trace.json.gz under "):
        profiling.summarize(str(tmp_path))
    write_trace(tmp_path, [op("ThunkExecutor::Execute", 0, 10)])
    with pytest.raises(ValueError, match="^no operations in the traces under "):
        profiling.timeline(str(tmp_path))
    write_trace(tmp_path, [op("fusion.1", 5, 0)])
    assert profiling.timeline(str(tmp_path)) == {
        "span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "idle_share": 0.0}


def test_train_profiles_its_steps_after_the_first_ten(tmp_path, capsys):
    """profile_steps=5 on a 13-step run traces steps 11-13 (the run ends first) into
    WORKDIR/plugins/profile/RUN with a summary; each record has its steps per second, and the
    first step says when it was done."""
    train(tiny_run(num_train_steps=13, log_every_steps=13, eval_every_steps=13,
                   checkpoint_every_steps=13, profile_steps=5), str(tmp_path))
    runs = os.listdir(tmp_path / "plugins" / "profile")
    assert len(runs) == 1
    summary = json.loads((tmp_path / "plugins" / "profile" / runs[0] / "summary.json").read_text())
    assert (summary["first_step"], summary["last_step"]) == (11, 13)
    # (The busy time is not compared with the wall time: step 10 may still be running when
    # the trace starts, and its end counts in the trace, not in the wall time.)
    assert summary["busy_ms_per_step"] > 0 and summary["wall_ms_per_step"] > 0
    assert summary["idle_ms_per_step"] >= 0 and 0 <= summary["idle_share"] < 1
    assert sum(o["share"] for o in summary["operations"]) <= 1 + 1e-9
    # The model's matmuls are in the trace (not always among the summary's top 15: on 8
    # simulated devices of a loaded CPU, the all-reduce's waits can fill it): XLA's "dot" or
    # YNNPACK's on a CPU, a GEMM fusion or cuBLAS's "nvjet" kernels on a GPU.
    traced = {o["operation"] for o in profiling.summarize(
        str(tmp_path / "plugins" / "profile" / runs[0]), top=None)}
    assert any(re.match(r"dot$|ynn_fusion|gemm_fusion_dot|nvjet", kind) for kind in traced), \
        traced
    # The same time by part of the model, from the step's program kept beside the trace.
    assert (tmp_path / "plugins" / "profile" / runs[0] / profiling.PROGRAM_FILE).exists()
    parts = {(p["pass"], p["part"]) for p in summary["parts"]}
    assert {("forward", "feed-forward"), ("backward", "feed-forward"),
            ("update", "optimizer")} <= parts, parts
    assert ("?", "command buffer") not in parts  # on a GPU: the step compiled with TRACEABLE
    assert sum(p["share"] for p in summary["parts"]) == pytest.approx(1.0)
    printed = "".join(capsys.readouterr())
    assert printed.count("profiled steps 11-13 into") == 1
    line = next(line for line in printed.splitlines() if "profiled steps 11-13" in line)
    top = summary["parts"][0]
    assert f"; by part: {top['pass']} {top['part']} {top['share']:.0%}" in line, line
    # Where the time to the first step went: three parts that add up to it.
    first = re.search(r"step 1 done ([\d.]+) s after the start: ([\d.]+) s reading or "
                      r"preparing the data, ([\d.]+) s building the state \(([\d.]+) s "
                      r"of it compiling and drawing its parameters\), ([\d.]+) s "
                      r"compiling and running the step", printed)
    assert first, printed
    total, data_s, state_s, drawing, step_s = map(float, first.groups())
    parts = [data_s, state_s, step_s]
    assert all(part >= 0 for part in parts) and parts[2] > 0
    # A part of the state's time (0.0 where this process compiled an equal model's init).
    assert 0 <= drawing <= state_s + 0.05
    assert abs(sum(parts) - total) <= 0.15  # each rounded to 0.1 s
    with open(tmp_path / "metrics.jsonl") as f:
        record = json.loads(f.readline())
    # 13 steps in the window; its rates count steps 2-10 (the first compiles, 11-13 are
    # traced), in a part of the run's time; their target tokens per step fill at most the
    # 8 rows of 24 tokens.
    assert record["step"] == 13 and 9 / record["steps_per_sec"] <= record["elapsed_s"]
    assert 0 < record["tokens_per_sec"] / record["steps_per_sec"] <= 8 * 24


def test_a_trace_that_cannot_start_is_one_warning_and_training_goes_on(tmp_path):
    """Another trace already running (a notebook's own): StepTrace raises a ProfileError,
    which the training loop turns into one warning, and its next step runs untraced."""
    import jax

    from transformer_jax.trainer import _Loop

    trace = profiling.StepTrace(str(tmp_path / "run"), first_step=0, steps=1)
    said = []
    log = type("Log", (), {"message": lambda self, text: said.append(text)})()
    jax.profiler.start_trace(str(tmp_path / "theirs"))
    try:
        assert _Loop._watch(log, trace.before, 10) is None
        assert _Loop._watch(log, trace.after, 11, jnp.ones(2)) is None  # not tracing
    finally:
        jax.profiler.stop_trace()
    assert len(said) == 1 and said[0].startswith("warning: cannot trace steps 11 and on: ")
    assert not (tmp_path / "run").exists()


def test_seconds_since_process_start_counts_from_the_kernels_record(tmp_path):
    """A child that sleeps 1.5 s first is at least 1.5 s old when it asks, and no older
    than its parent saw it run (10 ms ticks)."""
    code = ("import time; time.sleep(1.5); "
            "from transformer_jax.profiling import seconds_since_process_start as age; "
            "print(age())")
    before = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    ran = time.monotonic() - before
    if sys.platform != "linux":
        assert done.stdout.strip() == "None"
        return
    assert 1.5 <= float(done.stdout) <= ran + 0.01, (done.stdout, ran)


def instruction(name, op_name, root=False):
    """One line of a compiled program's HLO text, with the path JAX records."""
    return (f"  {'ROOT ' * root}%{name} = f32[4]{{0}} fusion(%p), kind=kLoop, calls=%c, "
            f'metadata={{op_name="{op_name}"}}')


LAYER_0 = ("jit(train_step)/while/body/closed_call/{}(Transformer){}/Transformer._features/"
           "decoder.features/layer_0/layer_0._residual/")
PROGRAM = "\n".join([
    "HloModule jit_train_step", "ENTRY %main {",
    "  %p = f32[4]{0} parameter(0), metadata={op_name=\"state.params[\\'w\\']\"}",
    instruction("loop_add_fusion.3",
                LAYER_0.format("transpose(jvp", ")") + "ffn_norm/LayerNorm_0/add"),
    instruction("gemm_fusion_dot.1", LAYER_0.format("jvp", "") + "ffn/wi/dot_general"),
    instruction("multiply_fusion", "jit(train_step)/optimizer/mul"),
    instruction("dynamic-update-slice_fusion.2", LAYER_0.format("jvp", "") + "dropout/mul"),
    "  ROOT %while.2 = (s32[], f32[4]{0}) while(%t), condition=%c, body=%b, "
    'metadata={op_name="jit(train_step)/while"}', "}"])


def test_parts_of_a_gpu_trace_by_instruction_and_kernel_name(tmp_path):
    """Kernels name their instruction in args["hlo_op"] or in their own name (every "." and
    "-" an "_"); a kernel the program does not name (cuBLAS's, here) is ("?", its kind), and
    another program's ("other program", its module). With a GPU in the trace the host's ops
    do not count."""
    gpu = {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}
    annotated = dict(op("sm90_xmma_gemm", 0, 30, pid=7),
                     args={"hlo_op": "gemm_fusion_dot.1", "hlo_module": "jit_train_step"})
    evaluation = dict(op("loop_add_fusion_3", 60, 4, pid=7),
                      args={"hlo_op": "loop_add_fusion.3", "hlo_module": "jit_eval_step"})
    write_trace(tmp_path, [gpu, op("host_fusion", 0, 100), annotated,
                           op("loop_add_fusion_3", 30, 10, pid=7),
                           op("multiply_fusion", 40, 5, pid=7), op("nvjet_tst_1", 45, 5, pid=7),
                           op("dynamic_update_slice_fusion_2", 50, 6, pid=7), evaluation])
    rows = profiling.summarize_parts(str(tmp_path), PROGRAM)
    assert [(r["pass"], r["part"], r["calls"]) for r in rows] == [
        ("forward", "feed-forward", 1), ("backward", "layer norm", 1),
        ("forward", "dropout", 1), ("update", "optimizer", 1), ("?", "nvjet_tst", 1),
        ("other program", "jit_eval_step", 1)]
    assert [r["ms"] for r in rows] == pytest.approx([0.030, 0.010, 0.006, 0.005, 0.005, 0.004])
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert rows[0]["share"] == pytest.approx(0.5)


SCHEDULED = "\n".join([  # a scheduled GPU program: a layer norm, cuBLAS, top-K, Adam, a copy
    "HloModule jit_train_step, is_scheduled=true", "ENTRY %main {",
    "  %p = f32[4]{0} parameter(0)",
    instruction("loop_add_fusion.3",
                LAYER_0.format("transpose(jvp", ")") + "self_attention_norm/LayerNorm_0/add"),
    "  %custom-call.2 = (f32[4]{0}, s8[16]{0}) custom-call(%loop_add_fusion.3), "
    'custom_call_target="__cublas$lt$matmul", '
    f'metadata={{op_name="{LAYER_0.format("jvp", "")}ffn/wi/dot_general"}}',
    "  %get-tuple-element.1 = f32[4]{0} get-tuple-element(%custom-call.2), index=0",
    "  %custom-call.6 = (f32[4]{0}, s32[4]{0}) custom-call(%get-tuple-element.1), "
    'custom_call_target="__gpu$TopK", metadata={scheduling_name="custom-call.6"}',
    instruction("multiply_fusion", "jit(train_step)/optimizer/mul"),
    '  ROOT %copy.5 = f32[4]{0} copy(%multiply_fusion), metadata={scheduling_name="copy.5"}',
    "}"])


def test_sums_across_devices_are_a_part_of_their_own(tmp_path):
    """An all-reduce XLA adds under `sharded` takes its first operand's path (here a
    backward layer norm's): it counts as the update's sums across devices, as its async
    halves on a GPU do; the layer norm keeps its own time."""
    program = PROGRAM.replace("  ROOT %while.2", "  %all-reduce.7 = f32[4]{0} all-reduce(%p), "
                              f'metadata={{op_name="{LAYER_0.format("transpose(jvp", ")")}'
                              'ffn_norm/LayerNorm_0/reduce_sum"}\n  ROOT %while.2')
    events = [dict(op("all-reduce.7", 0, 30), args={"hlo_op": "all-reduce.7"}),
              dict(op("loop_add_fusion.3", 31, 10), args={"hlo_op": "loop_add_fusion.3"}),
              dict(op("all-reduce-start", 42, 5), args={"hlo_op": "all-reduce-start.2"})]
    write_trace(tmp_path, events)
    rows = profiling.summarize_parts(str(tmp_path), program)
    assert [(r["pass"], r["part"], r["calls"], r["ms"]) for r in rows] == [
        ("update", "sums across devices", 2, pytest.approx(0.035)),
        ("backward", "layer norm", 1, pytest.approx(0.010))]


def test_every_kind_of_collective_and_both_its_halves_are_sums_across_devices(tmp_path):
    """A reduce-scatter (`sharded`'s gradients, split over the devices) and the "-done"
    half of an async all-reduce count as sums across devices, as an all-reduce and its
    "-start" do."""
    events = [dict(op(name, start, 10), args={"hlo_op": name}) for name, start in [
        ("reduce-scatter.4", 0), ("all-reduce-start.2", 20), ("all-reduce-done.2", 40),
        ("loop_add_fusion.3", 60)]]
    write_trace(tmp_path, events)
    rows = profiling.summarize_parts(str(tmp_path), PROGRAM)
    assert [(r["pass"], r["part"], r["calls"]) for r in rows] == [
        ("update", "sums across devices", 3), ("backward", "layer norm", 1)]


def test_parts_of_a_gpu_trace_inside_a_command_buffer_are_not_guessed(tmp_path):
    """A kernel in a CUDA graph names the graph, not its instruction, even when its own
    name is an instruction's (XLA gives identical fusions one kernel): it counts as ("?",
    "command buffer"). Instructions without a path count by opcode or custom call target."""
    gpu = {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}
    events, now = [gpu], 0
    for name, hlo_op, duration in [("loop_add_fusion_3", "command_buffer_1", 10),
                                   ("nvjet_sm90_tst", "custom-call.2", 20),
                                   ("void stream_executor::cuda::Run<4ul, float>",
                                    "custom-call.6", 5),
                                   ("memcpy128", "copy.5", 2), ("memcpy128", "copy.5", 1)]:
        events.append(dict(op(name, now, duration, pid=7),
                           args={"hlo_op": hlo_op, "hlo_module": "jit_train_step"}))
        now += duration + 1
    write_trace(tmp_path, events)
    rows = profiling.summarize_parts(str(tmp_path), SCHEDULED)
    assert [(r["pass"], r["part"], r["calls"]) for r in rows] == [
        ("forward", "feed-forward", 1), ("?", "command buffer", 1), ("?", "__gpu$TopK", 1),
        ("?", "copy", 2)]
    assert [r["ms"] for r in rows] == pytest.approx([0.020, 0.010, 0.005, 0.003])


def test_a_traced_benchmark_is_compiled_to_be_profiled_by_part():
    """While the suites trace their calls, their programs compile with
    `profiling.TRACEABLE` (on a GPU, no CUDA graphs); otherwise with XLA's defaults."""
    from transformer_jax.benchmark import timing

    class Jitted:
        def lower(self, *args):
            return self

        def compile(self, compiler_options=None):
            return compiler_options

    assert timing.compile_seconds(Jitted())[0] is None
    timing.trace_timed_calls("unused")
    try:
        assert timing.compile_seconds(Jitted())[0] == {"xla_gpu_enable_command_buffer": ""}
    finally:
        timing.trace_timed_calls(None)


def test_parts_of_a_cpu_trace_leave_out_the_runtimes_and_the_loops_spans(tmp_path):
    """On a CPU every XLA operation is annotated: a span without an instruction is the
    runtime's and is left out; another program's operation is ("?", its kind). A loop's
    span encloses its body's operations and is left out too, here and by `summarize`."""
    ours = dict(op("multiply_fusion", 1, 8), args={"hlo_op": "multiply_fusion"})
    theirs = dict(op("dot.4", 9, 2), args={"hlo_op": "dot.4"})
    loop = dict(op("while.2", 0, 12), args={"hlo_op": "while.2"})
    other_loop = dict(op("while.7", 20, 12), args={"hlo_op": "while.7"})
    write_trace(tmp_path, [loop, ours, theirs, other_loop,
                           op("PythonRefManager::CollectGarbage", 10, 50)])
    rows = profiling.summarize_parts(str(tmp_path), PROGRAM)
    assert [(r["pass"], r["part"], r["ms"]) for r in rows] == [
        ("update", "optimizer", pytest.approx(0.008)), ("?", "dot", pytest.approx(0.002))]
    assert [r["operation"] for r in profiling.summarize(str(tmp_path))] == [
        "multiply_fusion", "dot"]


def test_a_calls_and_a_branchs_spans_are_left_out_like_a_loops(tmp_path):
    """A "call" and a "conditional" enclose their body's operations, as a "while" does:
    neither `summarize` nor `summarize_parts` counts their spans beside the operations."""
    events = [dict(op(name, start, duration), args={"hlo_op": name})
              for name, start, duration in [("call.3", 0, 20), ("conditional.4", 1, 18),
                                            ("multiply_fusion", 2, 8)]]
    write_trace(tmp_path, events)
    assert [(r["operation"], r["calls"]) for r in profiling.summarize(str(tmp_path))] == [
        ("multiply_fusion", 1)]
    assert [(r["pass"], r["part"], r["share"]) for r in
            profiling.summarize_parts(str(tmp_path), PROGRAM)] == [("update", "optimizer", 1.0)]


def test_a_trace_without_instruction_names_is_read_by_the_programs_names(tmp_path):
    """Without args["hlo_op"] (older traces), an event names its instruction in its own
    name; a host span that names none of the program's ("np.asarray(jax.Array)", a wait
    for a result) is not a part of the step."""
    write_trace(tmp_path, [op("multiply_fusion", 0, 8), op("np.asarray(jax.Array)", 0, 500)])
    assert [(r["pass"], r["part"], r["ms"]) for r in
            profiling.summarize_parts(str(tmp_path), PROGRAM)] == [
        ("update", "optimizer", pytest.approx(0.008))]


@pytest.mark.parametrize("op_name, expected", [
    ("jit(train_step)/while/body/closed_call/jvp(Transformer)/Transformer._features/"
     "decoder.features/layer_1/layer_1._residual/dropout/jit(_threefry_fold_in)/xor",
     ("forward", "dropout")),
    ("jit(train_step)/while/body/closed_call/transpose(jvp(Transformer))/Transformer._features/"
     "Transformer.encode/encoder/layer_0/layer_0._residual/self_attention/"
     "self_attention.attend/query/dot_general", ("backward", "attention projections")),
    ("jit(train_step)/while/body/closed_call/jvp(Transformer)/Transformer._features/"
     "decoder.features/layer_0/layer_0._residual/cross_attention/cross_attention.attend/"
     "vmap(BTNH,BSNH->BNTS)/dot_general", ("forward", "attention")),
    ("jit(train_step)/while/body/closed_call/transpose(jvp(loss))/select_n",
     ("backward", "output layer and loss")),
    ("jit(train_step)/while/body/closed_call/jvp(Transformer)/Transformer._features/"
     "Transformer.encode/encoder/embedder.encode/jit(_take)/gather",
     ("forward", "embedding and positions")),
    ("jit(train_step)/while/body/closed_call/jvp(Transformer)/Transformer._features/"
     "Transformer.encode/encoder/positions/Dropout_0/add", ("forward", "dropout")),
    ("jit(train_step)/while/body/closed_call/jvp(Transformer)/Transformer._features/"
     "Transformer.encode/encoder/layer_0/layer_0._residual/self_attention/"
     "self_attention.attend/vmap(BNTS,BSNH->BTNH)/transpose", ("forward", "attention")),
    ("jit(train_step)/optimizer/sqrt", ("update", "optimizer")),
    ("jit(train_step)/while/body/closed_call/add", ("update", "other")),
])
def test_part_of_an_operation_from_its_path(op_name, expected):
    assert profiling.part_of(op_name) == expected


def test_a_searchs_parts_are_its_named_scopes_not_its_programs_name():
    """A search's program is jit(search): its own work is what its "search" scope holds,
    and an operation outside it (the encoder's padding mask) is not the search's."""
    encoder_mask = "jit(search)/Transformer.encode/encoder/ne"
    assert profiling.part_of(encoder_mask, training=False) == ("forward", "other")
    assert profiling.part_of("jit(search)/while/body/search/gt", training=False) == (
        "forward", "search")


def test_the_parts_of_a_compiled_decoder_layers_matmuls():
    """The op names JAX records for a decoder layer's matmuls, compiled: the 8 projections
    Q, K, V and W^O of its two attentions are "attention projections" (K and V were counted
    as "attention" when __call__ projected them outside a method of the module), the two
    of the feed-forward are "feed-forward", and attention's own products "attention"."""
    import jax

    from transformer_jax.layers import DecoderLayer
    from transformer_jax.model_config import get_model_config

    layer = DecoderLayer(get_model_config("tiny"))
    y_BTD, memory_BSD = jnp.ones((1, 3, 32)), jnp.ones((1, 5, 32))
    variables = layer.init(jax.random.key(0), y_BTD, memory_BSD)
    hlo = jax.jit(layer.apply).lower(variables, y_BTD, memory_BSD).compile().as_text()
    dots = sorted({name for name in re.findall(r'op_name="([^"]+)"', hlo)
                   if name.endswith("/dot_general")})
    parts = [profiling.part_of(name)[1] for name in dots]
    projections = [d for d in dots if re.search(r"/(query|key|value|out)/dot_general$", d)]
    assert len(projections) == 8, dots
    assert {profiling.part_of(d)[1] for d in projections} == {"attention projections"}
    assert parts.count("attention projections") == 8 and parts.count("feed-forward") == 2
    assert set(parts) == {"attention projections", "feed-forward", "attention"}, dots


def test_the_model_suites_profile_splits_the_step_by_part(tmp_path):
    """--profile keeps each case's trace beside its program: the tiny step's time falls in
    the model's parts, forward and backward, and the optimizer's update."""
    from transformer_jax.benchmark import model, timing

    case = next(c for c in model.cases(quick=True) if c.name == "tiny")
    timing.trace_timed_calls(str(tmp_path))
    try:
        model.time_train_step(case, "float32", "sharded", quick=True)
    finally:
        timing.trace_timed_calls(None)
    folder = "tiny-float32-sharded-loss_chunk=0"  # beside the peak matmul rate's own trace
    assert folder in os.listdir(tmp_path)
    program = (tmp_path / folder / profiling.PROGRAM_FILE).read_text()
    rows = profiling.summarize_parts(str(tmp_path / folder), program)
    found = {(r["pass"], r["part"]) for r in rows}
    for part in ("feed-forward", "layer norm", "attention", "attention projections",
                 "dropout", "output layer and loss"):
        assert {("forward", part), ("backward", part)} <= found, (part, found)
    assert ("update", "optimizer") in found
    assert ("?", "command buffer") not in found  # on a GPU: compiled with TRACEABLE
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    # Most of the time is the program's own, named operations (XLA's copies carry no path).
    assert sum(r["share"] for r in rows if r["pass"] != "?") > 0.5, rows


def test_the_decode_suites_profile_splits_a_search_into_the_decoder_and_its_own_work(
        tmp_path):
    """A beam search's program has no gradient: every part is its forward pass, and the
    search's own work (top-K, beams and caches reordered) is a part of its own."""
    from transformer_jax.benchmark import decode, timing

    timing.trace_timed_calls(str(tmp_path))
    try:
        decode.time_search("tiny", 2, 8, 8, beam_size=4, cached=True, quick=True)
    finally:
        timing.trace_timed_calls(None)
    folder = tmp_path / f"tiny-float32-beam4-cached-2x8-unroll{UNROLL}"
    rows = profiling.summarize_parts(str(folder), (folder / profiling.PROGRAM_FILE).read_text())
    found = {(r["pass"], r["part"]) for r in rows}
    assert {("forward", "search"), ("forward", "attention"), ("forward", "feed-forward"),
            ("forward", "output layer and loss")} <= found, found
    assert {r["pass"] for r in rows} <= {"forward", "?"}
    # The loop's own span (its whole time) is not counted beside its body's operations: it
    # is no row, and the named parts keep most of the time (counted twice, the loop would
    # hold at least half; XLA's copies, without a path, took 5-24 % in runs here).
    assert not {r["part"] for r in rows} & {"while", "conditional", "call"}, rows
    assert sum(r["share"] for r in rows if r["pass"] != "?") > 0.5, rows


def test_a_fusion_without_a_path_takes_its_computations_root():
    """A fusion XLA left without op_name takes its fused computation's: the root's (the
    fused layer norm's add), not that of the computation's first operation (a multiply of
    dropout's); a computation whose root has none, its first operation's with one."""
    hlo = "\n".join([
        "HloModule jit_train_step", "",
        "%fused_computation (p: f32[4]) -> f32[4] {",
        "  %p = f32[4]{0} parameter(0)",
        '  %multiply.1 = f32[4]{0} multiply(%p, %p), metadata={op_name="jit(step)/dropout/mul"}',
        "  ROOT %add.2 = f32[4]{0} add(%multiply.1, %p), "
        'metadata={op_name="jit(step)/ffn_norm/LayerNorm_0/add"}', "}", "",
        "%fused_computation.1 (q: f32[4]) -> f32[4] {",
        "  %q = f32[4]{0} parameter(0)",
        '  %sine.3 = f32[4]{0} sine(%q), metadata={op_name="jit(step)/ffn/sin"}',
        "  ROOT %copy.4 = f32[4]{0} copy(%sine.3)", "}", "",
        "ENTRY %main (x: f32[4]) -> f32[4] {",
        "  %x = f32[4]{0} parameter(0)",
        "  %fusion = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation",
        "  ROOT %fusion.1 = f32[4]{0} fusion(%fusion), kind=kLoop, calls=%fused_computation.1",
        "}"])
    names = profiling.op_names(hlo)
    assert (names["fusion"], names["fusion.1"]) == ("jit(step)/ffn_norm/LayerNorm_0/add",
                                                    "jit(step)/ffn/sin")


def test_sums_across_devices_of_a_program_that_does_not_train_are_its_forward_pass(tmp_path):
    """A search (no `transpose(` in its paths) has no update: its all-reduce counts as
    ("forward", "sums across devices")."""
    program = "\n".join([
        "HloModule jit_search", "ENTRY %main {",
        instruction("loop_add_fusion.3", "jit(search)/while/body/decoder/ffn/wi/dot_general"),
        '  ROOT %all-reduce.7 = f32[4]{0} all-reduce(%p), metadata={op_name="jit(search)/add"}',
        "}"])
    write_trace(tmp_path, [dict(op("all-reduce.7", 0, 30), args={"hlo_op": "all-reduce.7"}),
                           dict(op("loop_add_fusion.3", 31, 10),
                                args={"hlo_op": "loop_add_fusion.3"})])
    rows = profiling.summarize_parts(str(tmp_path), program)
    assert [(r["pass"], r["part"], r["calls"]) for r in rows] == [
        ("forward", "sums across devices", 1), ("forward", "feed-forward", 1)]


def test_timeline_counts_an_operation_inside_a_longer_one_once(tmp_path):
    """[0, 100] with [10, 30] inside it, then [150, 160] (µs): busy 110 of a span of 160; the
    inner operation's end does not close the outer one's stretch."""
    write_trace(tmp_path, [op("while.1", 0, 100), op("fusion.2", 10, 20, tid=2),
                           op("fusion.3", 150, 10)])
    assert profiling.timeline(str(tmp_path)) == pytest.approx(
        {"span_ms": 0.160, "busy_ms": 0.110, "idle_ms": 0.050, "idle_share": 50 / 160})


def test_a_step_traces_summary_is_per_traced_step(tmp_path):
    """Steps 11 and 12 traced (`steps=2` after the first 10): the summary's device times per
    step are its trace's `timeline` over those 2 steps."""
    import jax

    trace = profiling.StepTrace(str(tmp_path), first_step=0, steps=2)
    a = jnp.ones((128, 128))
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    trace.before(10)
    assert trace.tracing
    assert trace.after(11, matmul(a)) is None
    summary = trace.after(12, matmul(a))
    assert not trace.tracing
    device = profiling.timeline(summary["trace"])
    assert (summary["first_step"], summary["last_step"]) == (11, 12)
    assert summary["busy_ms_per_step"] == pytest.approx(device["busy_ms"] / 2)
    assert summary["idle_ms_per_step"] == pytest.approx(device["idle_ms"] / 2)
    assert summary["wall_ms_per_step"] > 0


def fake_profiler(monkeypatch, events, run="run"):
    """jax.profiler's start_trace and stop_trace, for a StepTrace: a stop writes `events`
    as the trace of the folder `run` under LOGDIR/plugins/profile, as JAX's profiler
    does; the returned list names each call."""
    calls, logdir = [], []

    def start_trace(folder):
        calls.append("start")
        logdir.append(folder)

    def stop_trace():
        calls.append("stop")
        write_trace(os.path.join(logdir[-1], "plugins", "profile", run), events)

    monkeypatch.setattr(jax.profiler, "start_trace", start_trace)
    monkeypatch.setattr(jax.profiler, "stop_trace", stop_trace)
    return calls


def test_a_step_trace_starts_once_and_its_summary_keeps_the_top_15_operations(
        tmp_path, monkeypatch):
    """Step 11 traced (`steps=1`): the steps after it are not traced again, and
    summary.json, beside the trace, lists the 15 operations that took the most time of the
    16 traced, as `summarize` does."""
    calls = fake_profiler(monkeypatch, [op(f"kind{k}.1", 20 * k, k + 1) for k in range(16)])
    trace = profiling.StepTrace(str(tmp_path), first_step=0, steps=1)
    trace.before(10)
    summary = trace.after(11, jnp.ones(2))
    for step in (11, 12, 20):
        trace.before(step)
        assert not trace.tracing
    assert calls == ["start", "stop"]
    assert [o["operation"] for o in summary["operations"]] == [
        f"kind{k}" for k in range(15, 0, -1)]
    assert summary["trace"] == str(tmp_path / "plugins" / "profile" / "run")
    assert json.loads((tmp_path / "plugins" / "profile" / "run" / "summary.json").read_text()
                      ) == summary


def test_a_step_trace_in_a_run_folder_whose_name_is_reused_summarizes_the_newest(
        tmp_path, monkeypatch):
    """Two traces in the same second share their folder's name: no new folder appears, and
    the summary is of the folder just written (the newest), not of an older trace's."""
    profiles = tmp_path / "plugins" / "profile"
    write_trace(profiles / "2025_01_01_00_00_00", [op("old_fusion.1", 0, 5)])
    os.utime(profiles / "2025_01_01_00_00_00", (1e9, 1e9))
    os.makedirs(profiles / "2025_01_01_00_00_01")
    os.utime(profiles / "2025_01_01_00_00_01", (1e9 + 1, 1e9 + 1))
    fake_profiler(monkeypatch, [op("fusion.1", 0, 5)], run="2025_01_01_00_00_01")
    trace = profiling.StepTrace(str(tmp_path), first_step=0, steps=1)
    trace.before(10)
    summary = trace.after(11, jnp.ones(2))
    assert summary["trace"] == str(profiles / "2025_01_01_00_00_01")
    assert [o["operation"] for o in summary["operations"]] == ["fusion"]


def test_a_step_trace_that_cannot_be_summarized_is_a_profile_error_and_tracing_ends(
        tmp_path, monkeypatch):
    """A step's program that cannot be read (JAX's error lowering it again), or a trace
    without an operation: one ProfileError each, naming the steps, and the trace is over
    (the loop goes on untraced)."""
    fake_profiler(monkeypatch, [op("fusion.1", 0, 5)])
    trace = profiling.StepTrace(str(tmp_path), first_step=0, steps=1)

    def program():
        raise RuntimeError("lowering failed")

    trace.before(10)
    with pytest.raises(profiling.ProfileError, match=r"^the program of steps 11-11 could not "
                                                     r"be read for the trace: lowering failed$"):
        trace.after(11, jnp.ones(2), program=program)
    assert not trace.tracing

    fake_profiler(monkeypatch, [op("ThunkExecutor::Execute", 0, 5)])
    trace = profiling.StepTrace(str(tmp_path / "empty"), first_step=4, steps=3)
    trace.before(14)
    with pytest.raises(profiling.ProfileError, match=r"^the trace of steps 15-16 in .*empty "
                                                     r"could not be summarized: no operations"):
        trace.after(16, jnp.ones(2), last=True)
    assert not trace.tracing


def test_a_step_trace_says_when_the_run_ends_before_it_starts():
    """Steps after the first 10 of a start are traced: a run that ends at step 10 (or a
    resume from step 5 that ends at 15) traces nothing and says so; one step more traces
    one; without profile_steps nothing is said."""
    assert profiling.StepTrace("W", first_step=0, steps=5).unreached(10) == (
        "note: nothing is traced: config.profile_steps traces steps after the first 10 of a "
        "start (from step 11), and this run ends at step 10")
    assert profiling.StepTrace("W", first_step=0, steps=5).unreached(11) is None
    assert "(from step 16), and this run ends at step 15" in profiling.StepTrace(
        "W", first_step=5, steps=5).unreached(15)
    assert profiling.StepTrace("W", first_step=5, steps=5).unreached(16) is None
    assert profiling.StepTrace("W", first_step=0, steps=0).unreached(5) is None
