"""Timing compiled calls: median wall time after warm-up (with the spread of the timed
calls), and compile time."""

import contextlib
import itertools
import os
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import jax

from transformer_jax import profiling

_trace_dir = None  # set by trace_timed_calls
_traces = itertools.count()  # each trace its own folder: the profiler names its by the second


def trace_timed_calls(directory: str | None) -> None:
    """From now on, record a JAX profiler trace of the timed calls (not the warm-up) of
    each measurement into its own folder `directory`/timed-NNN: the profile of the steady
    state, without compilation."""
    global _trace_dir, _traces
    _trace_dir, _traces = directory, itertools.count()


@contextlib.contextmanager
def traced_as(name: str, compiled):
    """The timed calls inside are traced into the subfolder `name` of the trace directory
    (its timed-NNN folders), beside `compiled`'s HLO (`profiling.PROGRAM_FILE`, which
    `profiling.summarize_parts` reads with the trace); nothing is written when nothing is
    traced. A `/` in `name` (an XLA option's path, in `--vary`) becomes `_`: the folder
    stays one level deep."""
    global _trace_dir
    outer = _trace_dir
    if outer is not None:
        _trace_dir = os.path.join(outer, name.replace(os.sep, "_"))
        os.makedirs(_trace_dir, exist_ok=True)
        with open(os.path.join(_trace_dir, profiling.PROGRAM_FILE), "w") as f:
            f.write(compiled.as_text())
    try:
        yield
    finally:
        _trace_dir = outer


class Seconds(NamedTuple):
    """The timed calls' seconds: their median, the fastest and the slowest, and how many."""

    median: float
    fastest: float
    slowest: float
    calls: int

    def columns(self) -> dict:
        """A row's columns: `timed` calls and their `spread`, (slowest - fastest) / median:
        a difference between rows smaller than their spreads is not a measured one."""
        return {"timed": self.calls, "spread": (self.slowest - self.fastest) / self.median}


def median_seconds(run_once: Callable[[], object], **timing) -> float:
    """The median of `timed_seconds(run_once, **timing)`."""
    return timed_seconds(run_once, **timing).median


def timed_seconds(run_once: Callable[[], object], *, warmup: int = 2, iters: int = 10,
                  budget_s: float = 30.0, traced: bool = True) -> Seconds:
    """Seconds of `run_once()`, which must block until its results are ready.

    Warm-up calls are not timed: they absorb compilation, autotuning and caches.
    Slow calls are timed fewer times (never under 3) to stay near `budget_s`.
    `traced=False`: not traced under `trace_timed_calls`, for what is not the suite's own
    work (the CPU peak's matmul).
    """
    start = time.perf_counter()
    for _ in range(warmup):
        start = time.perf_counter()
        run_once()
    last = time.perf_counter() - start
    if warmup and last * iters > budget_s:
        iters = max(3, int(budget_s / last))
    times = []
    tracing = (jax.profiler.trace(os.path.join(_trace_dir, f"timed-{next(_traces):03d}"),
                                  create_perfetto_trace=True) if _trace_dir and traced
               else contextlib.nullcontext())
    with tracing:
        for _ in range(iters):
            start = time.perf_counter()
            run_once()
            times.append(time.perf_counter() - start)
    return Seconds(statistics.median(times), min(times), max(times), len(times))


def alternated_steps(runs: dict[str, list], rounds: int, *,
                     warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of each train step in `runs` ({label: [step, state, batch]}), one step of
    each in turn per round, every one on the state its last step left (kept in `runs`);
    the first `warmup` rounds are not timed. On a machine whose speed drifts, compare two
    steps by the median of their ratios within rounds (BENCHMARKS.md's scripts)."""
    times = {label: [] for label in runs}
    for i in range(rounds):
        for label, run in runs.items():
            start = time.perf_counter()
            run[1], metrics = run[0](run[1], run[2])
            jax.block_until_ready(metrics)
            if i >= warmup:
                times[label].append(time.perf_counter() - start)
    return times


def back_to_back(call: Callable[[], jax.Array], calls: int) -> Callable[[], None]:
    """A `run_once` for `median_seconds` that queues `calls` calls and waits for the last:
    divide its seconds by `calls`. On a GPU this times the kernels, not the ~0.1 ms of
    dispatching and waiting that one blocked call adds to a 0.5 ms kernel."""
    def run_once():
        for _ in range(calls - 1):
            call()
        jax.block_until_ready(call())

    return run_once


def compile_seconds(jitted, *args, compiler_options: dict | None = None, **static):
    """(compiled executable, seconds to trace, lower and compile `jitted` for these args);
    `compiler_options` are XLA's (`{"xla_gpu_enable_cublaslt": True}`, as XLA_FLAGS would
    set them, for this program alone). While calls are traced (`trace_timed_calls`),
    compiled to be profiled by part (`profiling.TRACEABLE`: on a GPU, without command
    buffers)."""
    start = time.perf_counter()
    options = dict(profiling.TRACEABLE if _trace_dir is not None else {},
                   **(compiler_options or {}))
    compiled = jitted.lower(*args, **static).compile(compiler_options=options or None)
    return compiled, time.perf_counter() - start


MEMORY_NOTE = "memory_bytes: arguments + outputs + temporaries in XLA's buffer plan"
SPREAD_NOTE = ("timed: calls timed after the warm-up ones, the median reported; spread: "
               "(slowest - fastest) / median: rows closer than their spreads differ by noise")


def memory_bytes(compiled) -> int | None:
    """Peak bytes XLA's buffer assignment plans for a compiled call (arguments, outputs and
    temporaries), where the backend reports it."""
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, AttributeError, RuntimeError):
        return None
    if stats is None:
        return None
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes
             + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
    return int(total)
