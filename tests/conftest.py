"""Strict JAX for every test, and 8 simulated CPU devices for the multi-device ones; one
trained run that the tests reading a trained workdir share.

XLA_FLAGS must be set before JAX starts, so this runs before any test imports jax.
"""

import atexit
import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import NamedTuple

# The 8 simulated devices' programs meet in every all-reduce. XLA aborts the process when one
# comes 40 s after the others (its default); while another process used the 2 cores, that
# ended 3 of 7 runs of test_data_prepared.py and test_docs.py (in the training of conftest's
# `translating_run`), taking the whole suite down. 300 s still ends a true deadlock.
#
# On a machine where JAX has only the CPU, XLA compiles at optimization level 0 (LLVM's code
# generation without its optimizations). Compiling, not running, is most of the suite's time
# there: the tiny train step took 11.4-12.3 s to compile, 6.5-8.8 s at level 0; side by side
# (2-core AMD EPYC, jax 0.10.2, 2026-11-29), tests/test_train.py took 250 s against 323 s,
# and the whole suite passed in 0.76 x the test time (3,026 s; 3,967 s on 2026-11-28). The
# processes the tests start inherit it (train.py, translate.py, the notebooks' kernels).
# XLA's GPU backend compiles its kernels at the same level: with an accelerator's plugin
# installed, the suite compiles as a user's run does.
#
# Tried and not kept (2026-11-29): JAX's persistent compilation cache shared by a run's
# workers and the processes they start (programs of 1 s or more, so that a test loads what
# another compiled). Back to back from one fresh clone, `make test` passed in 1,031 s
# (pytest's wall time) with it and 1,006 s without. Keeping every program, with a size limit
# for JAX's lock of the folder, took 2,486 s in a run of its own. And a process stopped
# while JAX writes an entry leaves it truncated (JAX writes in place): the Ctrl-C test of
# translate.py did.
# Tried and not kept (2026-12-02): Python's garbage collector in the test processes freezing
# what was imported and waiting for 100,000 new objects (collecting was 9 % of the CPU time
# of a test that traces and compiles, by perf). Alone, test_model.py took 58 s against 66 s;
# in the whole suite, 1,083 s (pytest's wall time, -n 2) against 1,069 s the run before.
def _only_a_cpu() -> bool:
    """Whether JAX will find no accelerator: JAX_PLATFORMS says "cpu", or no plugin of one is
    installed (neither a `jax_plugins` package or entry point, as JAX finds them, nor libtpu)."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return True
    plugins = importlib.metadata.entry_points(group="jax_plugins")
    return not plugins and not any(importlib.util.find_spec(name)
                                   for name in ("jax_plugins", "libtpu"))


def _xla_accepts(flag: str) -> bool:
    """Whether this jaxlib's XLA knows `flag`: XLA aborts the process at an unknown one, so a
    process of its own asks, once a run (pytest-xdist's workers inherit the answer)."""
    known = "TRANSFORMER_JAX_TEST_XLA_ACCEPTS_" + flag.split("=")[0].strip("-").upper()
    if known not in os.environ:
        probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                               env=dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu"),
                               capture_output=True)
        os.environ[known] = str(probe.returncode == 0)
    return os.environ[known] == "True"


# XLA's CPU fusions compiled by its older emitters (LLVM IR written directly, not through
# MLIR). Compiling was 1,470 s of the suite's 3,030 test-seconds (jax.monitoring's
# backend_compile_duration, in the workers and the processes they start). With them, the
# tiny run of test_train.py compiled its 15 programs in 4.7-5.5 s against 7.6-8.7 s (3 runs
# each, alternated; 2-core AMD EPYC, jax 0.10.2, 2026-11-29), its loss equal to 1e-7 relative; the
# whole suite passed in 1,128 s (pytest's wall time, -n 2) against 1,559 and 1,575 s in the
# two runs before it (which also recorded compile times). A jaxlib that no longer has the
# flag compiles as it does by default.
#
# And its LLVM code generated as one module, not split into parts for threads: the 2 cores
# are busy with the suite's two workers anyway. Compiling the tiny train step (1 layer,
# jit), alternated in one process through compiler_options, took 1.43, 1.58 and 1.84 s of
# CPU time (medians of 5-9) against 1.95, 1.94 and 2.14 s split (2-core Intel Xeon, jax
# 0.10.2, 2026-11-30); a small beam search's program compiled in the same time either way.
#
# Both are the CPU backend's own options, so they hold on a GPU's host too, for the tests on
# simulated CPU devices and the processes they start; a GPU's kernels compile as by default.
LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
ONE_CODEGEN_PART = "--xla_cpu_parallel_codegen_split_count=1"
FAST_COMPILE = " ".join(
    (["--xla_backend_optimization_level=0"] if _only_a_cpu() else [])
    + [flag for flag in (LEGACY_EMITTERS, ONE_CODEGEN_PART) if _xla_accepts(flag)])
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    " --xla_cpu_collective_call_terminate_timeout_seconds=300 " + FAST_COMPILE
).strip()

# pytest-xdist's workers share a GPU: JAX's default, each process taking 75 % of its memory
# at start, ran the later workers out of memory (an H100, `-n 12`: 161 tests failed with
# RESOURCE_EXHAUSTED). Each process takes what it uses instead.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import ml_collections  # noqa: E402
import pytest  # noqa: E402

# JAX's rules for every test, set in this process and, through the environment (JAX reads
# JAX_<NAME> when it starts), in the processes the tests start: train.py, translate.py,
# evaluate.py, the notebooks' kernels.
#
# jax_numpy_dtype_promotion: no implicit dtype promotion (int with float, bfloat16 with
# float32): every mix is a cast written in the code. Library internals that mix run under
# "standard": the package's calls of optax's Adam, jax.nn's XLA attention and Flax's
# LayerNorm, and the tests below that use the `standard_dtype_promotion` fixture. On GPUs
# too: their cuDNN, Triton and bfloat16 paths are lowered for CUDA under strict promotion on
# any machine (tests/test_gpu_lowering.py), and run strict in the suite on a GPU. One path
# does not lower under strict promotion, on any backend, in JAX itself: jax.nn's bfloat16
# XLA attention, differentiated (lowering its BF16_BF16_F32 dot preset beside a float32
# cotangent calls `promote_types`, under the promotion in force when it lowers); "auto"
# runs cuDNN there where cuDNN can, and the tests of that path use the fixture.
#
# jax_default_matmul_precision: full float32 matmuls on GPUs too (TF32 would break the 1e-5
# tolerances, and a started process would compute otherwise than the test comparing it).
JAX_RULES = {"jax_numpy_rank_promotion": "raise", "jax_numpy_dtype_promotion": "strict",
             "jax_default_matmul_precision": "highest"}
for _name, _value in JAX_RULES.items():
    jax.config.update(_name, _value)
    os.environ[_name.upper()] = _value

# One scratch directory per process, removed when it exits: datasets the tests build (the
# small "numbers") go there, not to ~/tensorflow_datasets (pytest-xdist workers would
# otherwise race to build the same dataset; TFDS reads the variable when it is imported),
# and so do the temporary files of the tests and of the processes they start (see
# `temporary_files_in_scratch`): TFDS leaves an empty mkdtemp() folder behind for each
# builder of a dataset not yet prepared, about 140 per run of the suite.
SCRATCH = pathlib.Path(tempfile.mkdtemp(prefix="transformer-jax-tests-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
if os.environ.get("TFDS_DATA_DIR") in (None, os.environ.get("TRANSFORMER_JAX_TEST_TFDS_DIR")):
    os.environ["TFDS_DATA_DIR"] = str(SCRATCH / "tfds")
    os.environ["TRANSFORMER_JAX_TEST_TFDS_DIR"] = os.environ["TFDS_DATA_DIR"]


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_scratch(tmp_path_factory):
    """tempfile's folder (and TMPDIR, for the processes the tests start) in SCRATCH, once
    pytest has placed its own tmp_path folders (kept after a run, for a failure's files)."""
    tmp_path_factory.getbasetemp()
    (SCRATCH / "tmp").mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(SCRATCH / "tmp"))
        patch.setenv("TMPDIR", str(SCRATCH / "tmp"))
        yield


@pytest.fixture
def standard_dtype_promotion():
    """JAX's standard dtype promotion for one test: for tests that call optax's Adam
    directly (it raises a float to its int32 step count)."""
    with jax.numpy_dtype_promotion("standard"):
        yield


class TrainedRun(NamedTuple):
    """A trained workdir the tests share: they read it, and copy it to change anything."""

    workdir: pathlib.Path
    config: ml_collections.ConfigDict  # run_configs.shared_run(), what it was trained with
    records: list[dict]  # the training records `train` returned
    fetched: list[list[str]]  # the keys of each tree its training brought to the host


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> TrainedRun:
    """run_configs.shared_run() trained once: the first pytest-xdist worker to need it
    trains it, the others wait for it and read what it wrote."""
    from run_configs import shared_run, train_counting_fetches

    config = shared_run()

    def train_here(workdir: pathlib.Path, summary: pathlib.Path) -> None:
        summary.write_text(json.dumps(train_counting_fetches(config, workdir)))

    return _trained_once(tmp_path_factory, "trained_run", config, train_here)


@pytest.fixture(scope="session")
def translating_run(tmp_path_factory) -> TrainedRun:
    """run_configs.translating_run() trained once (as `trained_run`): a model whose
    translations end where the data's do (test BLEU about 64), for comparing searches.

    It trains in a process of its own, as a user's run does: XLA's defaults (on a CPU, one
    device and its optimizations), not this process's 8 devices compiled for speed of
    compiling. Its steps are mostly running, not compiling: 300 took 36 s there against
    64 s here (2-core AMD EPYC, jax 0.10.2, one run each, 2026-11-29), and its 400 took
    37 s to test BLEU 64 (58.7 after 300 here). Its config here has this process's rows
    per device; it trained on the same 32 rows an update."""
    from run_configs import translating_run

    def train_in_its_own_process(workdir: pathlib.Path, summary: pathlib.Path) -> None:
        env = {name: value for name, value in os.environ.items() if name != "XLA_FLAGS"}
        script = pathlib.Path(__file__).parent / "train_translating_run.py"
        done = subprocess.run([sys.executable, str(script), str(workdir), str(summary)],
                              env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    return _trained_once(tmp_path_factory, "translating_run", translating_run(),
                         train_in_its_own_process)


def _trained_once(tmp_path_factory, name: str, config, train) -> TrainedRun:
    """`config` trained once into the session's folder by `train(workdir, summary)`, which
    writes `summary`, the JSON of run_configs.train_counting_fetches."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, shared by its workers
    workdir, summary = root / name, root / f"{name}.json"
    with _exclusive(root / f"{name}.lock"):
        if not summary.exists():
            shutil.rmtree(workdir, ignore_errors=True)  # a worker's failed attempt
            train(workdir, summary)
    return TrainedRun(workdir, config, **json.loads(summary.read_text()))


@contextlib.contextmanager
def _exclusive(lock_file: pathlib.Path):
    """Holds an exclusive lock on `lock_file` (an flock, released if the process dies)."""
    with open(lock_file, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

