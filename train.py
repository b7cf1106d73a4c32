"""Trains the Transformer: `python train.py --config=configs/default.py --workdir=runs/default`.

Override any config key with `--config.key=value` (e.g. `--config.num_train_steps=500`).
Running the same command again resumes from the latest checkpoint in the workdir.
Several hosts: start one process per host with --coordinator_address, --num_processes
and --process_id, or with --cluster where the cluster started them (SLURM, Open MPI,
Cloud TPU) and JAX reads them from its environment.
"""

import signal

from transformer_jax.stop_signal import stop_while_starting

# SIGTERM and Ctrl-C from here until the trainer's handlers take over: one line and exit
# status 1 (stop_signal.stop_while_starting), not a traceback from inside an import. Not in
# grain's worker processes, which import this file as __mp_main__: they end with the run.
if __name__ == "__main__":
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where ignored
        signal.signal(signal.SIGINT, stop_while_starting)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, stop_while_starting)

import functools
import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

# Only what reads the command line and checks the config here: a mistake in them is said
# before JAX, Flax and orbax load (0.25 s, not 2.5); the training's modules load in main.
from transformer_jax import processes
from transformer_jax.command_line import loaded_config, parse_flags
from transformer_jax.commands import refuse_arguments
from transformer_jax.config_checks import ConfigError, check_config

# Beside this file, as a path from the current folder ("configs/default.py" from here),
# so that `python path/to/train.py --workdir=...` finds it from any folder.
DEFAULT_CONFIG = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              "configs", "default.py"))
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "a config file (configs/*.py)", lock_config=True)
flags.FLAGS["config"].default_as_str = repr(DEFAULT_CONFIG)  # --help's; loaded_config's default
_WORKDIR = flags.DEFINE_string("workdir", None, "where checkpoints, logs and the tokenizer go",
                               required=True)
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0, for runs of several processes")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "processes in the run")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "this process's index")
_CLUSTER = flags.DEFINE_bool("cluster", False, "join the run of several processes the cluster "
                             "started (SLURM, Open MPI, Cloud TPU): JAX reads the coordinator, "
                             "the count and this process's index from its environment")
_JOIN_TIMEOUT = flags.DEFINE_integer("initialization_timeout", processes.JOIN_TIMEOUT_S,
                                     "seconds the processes of a run wait for one another "
                                     "to start", lower_bound=1)


def main(argv) -> None:
    refuse_arguments(argv, "--config=configs/default.py --workdir=runs/default")
    config = loaded_config(_CONFIG.value)
    try:  # all but the devices' checks: the backend starts after the processes join
        check_config(config, devices=False)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    _train(config)


def _train(config) -> None:
    """Joins the run's processes and trains, each failure one line: the imports of training."""
    from transformer_jax import profiling, trainer
    from transformer_jax.checkpoint import CheckpointWriteError, NoCheckpointReadsError
    from transformer_jax.compilation_cache import use_compilation_cache
    from transformer_jax.data import DataError
    from transformer_jax.metrics_window import NonFiniteLossError
    from transformer_jax.output_paths import OutputPathError
    from transformer_jax.plot import MetricsError
    from transformer_jax.run_log import MetricsWriteError
    from transformer_jax.stop_signal import StoppedAtOnce

    age = profiling.seconds_since_process_start()
    launched = None if age is None else time.monotonic() - age  # for the first step's line
    logging.set_verbosity(logging.WARNING)  # orbax and TFDS report every file at INFO
    # Before the processes join, so that no process of a run compiles (and saves) while
    # another still checks the cache's entries.
    use_compilation_cache(_WORKDIR.value)
    try:
        processes.initialize_processes(_COORDINATOR.value, _NUM_PROCESSES.value,
                                       _PROCESS_ID.value, cluster=_CLUSTER.value,
                                       timeout_s=_JOIN_TIMEOUT.value)
    except processes.JoinError as error:
        sys.exit(f"error: {error}")
    try:
        trainer.train(config, _WORKDIR.value, launched=launched)
    except (ConfigError, OutputPathError, DataError, NonFiniteLossError,
            CheckpointWriteError, NoCheckpointReadsError, MetricsError,
            MetricsWriteError) as error:
        sys.exit(f"error: {error}")
    except StoppedAtOnce as error:
        # XLA looks for signals while it compiles, so the stop may have been raised inside a
        # compilation; the interpreter's exit after that crashes (SIGSEGV, jax 0.10 on CPU).
        # Nothing is left to save or release (the workdir lock is): leave without teardown.
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=functools.partial(parse_flags, default_config=DEFAULT_CONFIG))
