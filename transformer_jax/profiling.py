"""Where the time goes: JAX profiler traces, summed per kind of XLA operation, and the
device's busy and idle time.

    python -m transformer_jax.benchmark model --profile=runs/profile
    python train.py --config=... --workdir=W --config.profile_steps=20   # W/plugins/profile/

The benchmark suites trace every timed call (not the warm-up, so no compilation); train.py
traces `profile_steps` steps of the run itself after its first `PROFILE_AFTER_STEPS`, with
whatever the loop does between them (input, logging, evaluation, checkpoints). Open the
traces in Perfetto or TensorBoard's profiler, or read `summarize` and `timeline`.

`summarize` groups operations by fusion kind: on CPUs "ynn_fusion" is a matmul run by
YNNPACK, "copy_bitcast_fusion" and "transpose_copy_fusion" move data into another layout,
"broadcast_add_fusion" and the like are elementwise. A loop's or a branch's own span ("while",
"conditional": on a CPU it encloses its body's operations) is left out. Their times are summed
over threads, so on a 2-core CPU they can add up to about twice the wall time. On a GPU the
kernels are summed instead, by name ("gemm_fusion_dot", "nvjet_*" for cuBLAS, "cudnn_*" for
attention, "input_*_fusion" and "loop_*_fusion" for XLA's own): device time.

`summarize_parts` groups one program's operations by the part of the model they came from
(`part_of` their op_name: layer norm, dropout, attention, the optimizer, ...), forward and
backward, reading the program's compiled HLO beside its trace (the `model` suite's
`--profile` writes it there).
"""

import collections
import glob
import gzip
import json
import os
import re
import time
from collections.abc import Callable

import jax

from transformer_jax.atomic_file import atomic_write

PROGRAM_FILE = "program.hlo.txt"  # a traced program's HLO, beside its trace (benchmarks)
# Compiler options for a program profiled by part: no command buffers (CUDA graphs). Inside
# one a kernel's trace event names only the graph, and identical fusions share one kernel
# named for the first, so its time cannot be given to its instruction. A program compiled so
# launches each kernel itself: its times are not the graph's. Nothing changes on a CPU.
TRACEABLE = {"xla_gpu_enable_command_buffer": ""}
PROFILE_AFTER_STEPS = 10  # train.py's trace starts after this many steps (compiling, warm-up)

# Events that are not XLA operations: the Python side and the runtime's own spans.
# (XLA's instruction names hold no spaces and no "::".)
_NOT_OPS = re.compile(r"^\$|^end: |Thunk|Pjit|PjRt|block_until_ready|ThreadPool|ExecuteReplicated|"
                      r"ParseArguments|shard_args|ExecuteHelper|AllocateOutputBuffers|::| ")


def _op_events(trace_dir: str) -> tuple[list[dict], bool]:
    """(the complete ("X") events of XLA's operations in every trace under `trace_dir`,
    whether a GPU is in it): with a GPU, only the GPU's own (its kernels); otherwise the
    XLA operations of every host thread, not the Python side's spans."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}")
    events = []
    for path in paths:
        with gzip.open(path) as f:
            events += json.load(f)["traceEvents"]
    gpus = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and "GPU" in str(e.get("args", {}).get("name", ""))}
    spans = [e for e in events if e.get("ph") == "X"]
    if gpus:
        return [e for e in spans if e["pid"] in gpus], True
    # XLA's CPU operations name their instruction in args (jax 0.10); the Python side's
    # spans ("np.asarray(jax.Array)": a host waiting for a result) do not. A trace whose
    # events have no such args is told by the names.
    if any("hlo_op" in e.get("args", {}) for e in spans):
        return [e for e in spans if "hlo_op" in e.get("args", {})], False
    return [e for e in spans if not _NOT_OPS.search(e["name"])], False


def summarize(trace_dir: str, top: int | None = 15) -> list[dict]:
    """The `top` operation kinds (None: all) by total time over every trace under
    `trace_dir`."""
    micros, count = collections.Counter(), collections.Counter()
    for event in _op_events(trace_dir)[0]:
        kind = re.sub(r"[._]\d+$", "", event["name"])[:100]  # "ynn_fusion.12" -> "ynn_fusion"
        if kind in _CONTROL_FLOW:
            continue
        micros[kind] += event.get("dur", 0)
        count[kind] += 1
    total = sum(micros.values()) or 1
    return [{"operation": kind, "ms": us / 1e3, "share": us / total, "calls": count[kind]}
            for kind, us in micros.most_common(top)]


# The parts of a train step, by the path JAX records for each operation (its `op_name`:
# Flax's module names, the step's named scopes "loss" and "optimizer"), first match wins.
_PARTS = (
    ("dropout", r"dropout|Dropout"),
    ("layer norm", r"_norm(/|$)|LayerNorm|layer_norm"),
    ("attention projections", r"attention\.\w+/(query|key|value|out)(/|$)"),
    ("attention", r"attention"),
    ("feed-forward", r"/ffn/"),
    ("embedding and positions", r"embedder\.encode|positions"),
    ("output layer and loss", r"embedder\.(decode|loss)|[/(]loss([/)]|$)"),
    ("optimizer", r"/optimizer(/|$)"),
    ("search", r"/search(/|$)"),  # a search's own work: top-K, reordering beams and caches
)


def part_of(op_name: str, *, training: bool = True) -> tuple[str, str]:
    """(pass, part) of an operation from its `op_name`: pass "forward" (under `jvp`, or any
    operation of a program that is not `training`), "backward" (`transpose`) or "update"
    (neither, in a train step: the optimizer, the step's bookkeeping); part one of
    `_PARTS`' names (dropout's keys count as dropout), or "other" (casts, the step's
    count, ...)."""
    where = "backward" if "transpose(" in op_name else "forward" \
        if "jvp(" in op_name or not training else "update"
    part = next((name for name, pattern in _PARTS if re.search(pattern, op_name)), "other")
    return where, part


# Kinds of instructions whose spans enclose other operations' (a loop's body, a branch).
_CONTROL_FLOW = ("while", "conditional", "call")
# Instructions that move values between devices: pmap's psums keep their own path, but an
# all-reduce XLA adds under `sharded` (several gradients combined) takes its first
# operand's, which named a backward layer norm for the whole sum of the gradients.
_COLLECTIVE = re.compile(r"(all-reduce|all-gather|reduce-scatter|all-to-all|"
                         r"collective-permute)(-start|-done)?$")


def op_names(hlo_text: str) -> dict[str, str]:
    """{instruction: op_name} of a compiled program's HLO text (`compiled.as_text()`). A
    fusion that XLA left without a path takes its fused computation's: its root's, or else
    its first operation's with one."""
    paths, fused, of_computation = {}, {}, {}
    for block in re.split(r"\n(?=\S)", hlo_text):  # computations start at column 0
        computation = re.match(r"(?:ENTRY )?%?([\w.-]*)", block).group(1)
        for root, name, body in re.findall(r"^\s+(ROOT )?%?([\w.-]+) = (.*)$", block,
                                           flags=re.MULTILINE):
            path = re.search(r"op_name=\"([^\"]*)\"", body)
            if path:
                paths[name] = path.group(1)
                if root or computation not in of_computation:
                    of_computation[computation] = path.group(1)
            elif called := re.search(r"calls=%?([\w.-]+)", body):
                fused[name] = called.group(1)
    paths.update((name, of_computation[called]) for name, called in fused.items()
                 if called in of_computation)
    return paths


def _kinds(hlo_text: str) -> dict[str, str]:
    """{instruction: what it is called in `summarize_parts` without a path} of a program's
    HLO text: a custom call's target ("__gpu$TopK"), else its name without its number
    ("copy", "wrapped_concatenate")."""
    return {name: target.group(1) if (target := re.search(r'custom_call_target="([^"]+)"', rest))
            else re.sub(r"[._]\d+$", "", name)
            for name, rest in re.findall(r"^\s+(?:ROOT )?%?([\w.-]+) = (.*)$", hlo_text,
                                         re.MULTILINE)}


def summarize_parts(trace_dir: str, hlo_text: str) -> list[dict]:
    """The time of the traced operations of one program (`hlo_text`, its compiled HLO) by
    `part_of` their op_name, largest first: what a step spends on its layer norms, its
    dropout, its optimizer, forward and backward; what a search spends in the decoder and
    in its own work. An event names its instruction in `args["hlo_op"]` (XLA's
    annotation), or, without one, in its name (a GPU's kernel: "loop_add_fusion_3" for
    "loop_add_fusion.3"). An instruction without a path (a copy XLA added, top-K) counts as
    ("?", its `_kinds`), a kernel the program does not name (a library's) as ("?", its
    kind), another program's (`args["hlo_module"]`: an evaluation inside train.py's traced
    steps) as ("other program", its module), and a kernel inside a CUDA graph as ("?",
    "command buffer"): there `hlo_op` names only the graph, and XLA gives identical fusions
    one kernel, named for the first, so the program must be compiled with `TRACEABLE` for
    its kernels to be told apart. Collectives (the gradients' and metrics' sums) count as
    ("update", "sums across devices"), or ("forward", ...) in a program that is not
    training."""
    names, kinds = op_names(hlo_text), _kinds(hlo_text)
    module = re.match(r"HloModule ([\w.-]+)", hlo_text)
    kernels = {re.sub(r"\W", "_", name): name for name in kinds}  # "." and "-" become "_"
    training = any("transpose(" in op_name for op_name in names.values())
    micros, count = collections.Counter(), collections.Counter()
    events, on_gpu = _op_events(trace_dir)
    for event in events:
        args = event.get("args", {})
        op = args.get("hlo_op") or kernels.get(event["name"], event["name"])
        kind = re.sub(r"[._]\d+$", "", op)
        if kind in _CONTROL_FLOW:
            continue  # a loop's span (any program's): its body's operations are counted
        if module and args.get("hlo_module") not in (None, module.group(1)):
            key = ("other program", args["hlo_module"])
        elif _COLLECTIVE.match(kinds.get(op, kind)):
            key = ("update" if training else "forward", "sums across devices")
        elif op in names:
            key = part_of(names[op], training=training)
        elif op in kinds:
            key = ("?", kinds[op])
        elif kind == "command_buffer":
            key = ("?", "command buffer")
        elif args.get("hlo_op") or on_gpu:
            key = ("?", re.sub(r"[._]\d+$", "", event["name"]))
        else:
            continue  # a host runtime's span (a CPU's XLA operations are all annotated)
        micros[key] += event.get("dur", 0)
        count[key] += 1
    total = sum(micros.values()) or 1
    return [{"pass": where, "part": part, "ms": us / 1e3, "share": us / total,
             "calls": count[where, part]} for (where, part), us in micros.most_common()]


def timeline(trace_dir: str) -> dict[str, float]:
    """From the first operation's start to the last one's end (`span_ms`): the time at least
    one operation ran (`busy_ms`, overlapping operations counted once) and the rest
    (`idle_ms`, `idle_share`). On a GPU, idle is the time the GPU waited for the host
    (input, dispatch, syncs) in the span; on a CPU, the time no XLA operation ran."""
    intervals = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in _op_events(trace_dir)[0])
    if not intervals:
        raise ValueError(f"no operations in the traces under {trace_dir}")
    busy, (start, end) = 0.0, intervals[0]
    span_start = start
    for begin, finish in intervals[1:]:
        if begin > end:  # a gap: close the busy stretch
            busy, start = busy + end - start, begin
        end = max(end, finish)
    busy += end - start
    span = end - span_start
    return {"span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_ms": (span - busy) / 1e3,
            "idle_share": (span - busy) / span if span else 0.0}


def seconds_since_process_start() -> float | None:
    """How long ago this process started, by the kernel's record of it (Linux: its start in
    /proc/self/stat, in clock ticks since boot, against the boot clock; 10 ms resolution),
    so that Python's own start and the imports count; None where there is no such record."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command's name
        start_ticks = int(fields[19])  # field 22, starttime; fields[0] is field 3
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class ProfileError(Exception):
    """A trace that could not be taken or summarized; the training it watched goes on."""


class StepTrace:
    """Traces `steps` steps of a training loop, after its first `PROFILE_AFTER_STEPS`, into
    `logdir`/plugins/profile/RUN/ (where TensorBoard's profiler looks: the run's TensorBoard
    folder shows it), and writes RUN/summary.json: the steps, their wall time, the device's
    `timeline` per step, the top operations over all the traced steps (`summarize`) and,
    given the step's program, their time by part of the model (`summarize_parts`; the
    program kept as RUN/program.hlo.txt).
    A trace that cannot be taken (another one is running) or summarized (a full disk) is
    a ProfileError, after which the loop goes on untraced.

        trace = StepTrace(logdir, first_step=0, steps=20)
        for step in ...:
            trace.before(step)                        # the step about to run is step + 1
            metrics = train_step(...)
            summary = trace.after(step + 1, metrics)  # a dict once, at the trace's end
    """

    def __init__(self, logdir: str, *, first_step: int, steps: int):
        self.logdir, self.steps = logdir, steps
        self.start_step = first_step + PROFILE_AFTER_STEPS  # traced: start_step + 1, ...
        self._started = self._runs = None

    def unreached(self, last_step: int) -> str | None:
        """A line saying that nothing will be traced, when the loop ends at `last_step`
        before the trace would start; else None."""
        if self.steps and self.start_step >= last_step:
            return (f"note: nothing is traced: config.profile_steps traces steps after the "
                    f"first {PROFILE_AFTER_STEPS} of a start (from step {self.start_step + 1}), "
                    f"and this run ends at step {last_step}")
        return None

    @property
    def tracing(self) -> bool:
        """Whether steps are being traced now (from `before` to `after` at the last one)."""
        return self._started is not None

    def before(self, step: int) -> None:
        if self.steps and step == self.start_step:
            self._runs = set(self._run_folders())
            try:
                jax.profiler.start_trace(self.logdir)
            except RuntimeError as error:  # "Profile has already been started"
                raise ProfileError(f"cannot trace steps {step + 1} and on: {error}") from None
            self._started = time.perf_counter()

    def after(self, step: int, outputs, *, last: bool = False,
              program: Callable[[], str] | None = None) -> dict | None:
        """At the trace's last step (or the loop's: `last`), waits for `outputs`, stops
        tracing and returns the summary (with its folder, "trace"); otherwise None.
        `program()`, the traced step's compiled HLO text, adds its time by part of the model
        ("parts": `summarize_parts`) and is kept beside the trace (`PROGRAM_FILE`)."""
        if self._started is None or not (step == self.start_step + self.steps or last):
            return None
        jax.block_until_ready(outputs)
        wall_ms = (time.perf_counter() - self._started) * 1e3
        jax.profiler.stop_trace()
        self._started = None
        try:
            new = set(self._run_folders()) - self._runs
            folder = max(new or self._run_folders(), key=os.path.getmtime)  # a name reused
            steps, device = step - self.start_step, timeline(folder)
            summary = {"trace": folder, "first_step": self.start_step + 1, "last_step": step,
                       "wall_ms_per_step": wall_ms / steps,
                       "busy_ms_per_step": device["busy_ms"] / steps,
                       "idle_ms_per_step": device["idle_ms"] / steps,
                       "idle_share": device["idle_share"], "operations": summarize(folder)}
            if program is not None:
                try:
                    text = program()
                except Exception as error:  # noqa: BLE001  # JAX's errors, lowering again
                    raise ProfileError(f"the program of steps {self.start_step + 1}-{step} "
                                       f"could not be read for the trace: {error}") from None
                with atomic_write(os.path.join(folder, PROGRAM_FILE), "w") as f:
                    f.write(text)
                summary["parts"] = summarize_parts(folder, text)
            with atomic_write(os.path.join(folder, "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
        except (OSError, ValueError) as error:  # no trace written, a full disk
            raise ProfileError(f"the trace of steps {self.start_step + 1}-{step} in "
                               f"{self.logdir} could not be summarized: {error}") from None
        return summary

    def close(self) -> None:
        """Stops a trace left running (the loop ended by an error), keeping what it has."""
        if self._started is not None:
            self._started = None
            jax.profiler.stop_trace()

    def _run_folders(self) -> list[str]:
        return glob.glob(os.path.join(self.logdir, "plugins", "profile", "*"))
