"""Checkpoints: orbax's `CheckpointManager`, async, keeping the last N steps.

One checkpoint per step holds three items:

    "state"     the training state pytree (StandardSave): params, optimizer
                state, step. A flax `TrainState` can be saved as it is:
                `apply_fn` and `tx` are static fields, not leaves, so they are
                not written and come back from the abstract state on restore.
    "data"      {"data_states": [...]}, the data-iterator state of every
                process, indexed by process (JsonSave), for an exact resume.
    "metadata"  the run config, tokenizer path and model config (JsonSave),
                readable alone so a resume can refuse a different model before
                anything compiles.

Multi-host: every process calls `save` and `restore` (orbax synchronises them);
the JSON items are written by the primary process only, so `data_states` must
already hold every process's state.

orbax 0.12 notes: `reached_preemption` is always False without
`jax.distributed`, so preemption saves are the trainer's job (SIGTERM);
`CheckpointManager.save` first waits for the previous async save to finish.
"""

import contextlib
import gc
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from typing import TypeVar

import jax
import orbax.checkpoint as ocp

T = TypeVar("T")

_STATE, _DATA, _METADATA = "state", "data", "metadata"


class DamagedCheckpointError(Exception):
    """A checkpoint step whose files cannot be read."""

    def __init__(self, step: int, where: str):
        super().__init__(f"checkpoint {step} cannot be read: {where}")
        self.step, self.where = step, where


@contextlib.contextmanager
def _quiet_orphaned_reads(grace_s: float = 0.5):
    """When one array of a damaged checkpoint fails, orbax raises that error at once and
    closes its event loop while the reads of the other arrays are still in flight; as
    they finish, each would print a traceback ("Event loop is closed") through Python's
    hooks. On a failure this waits `grace_s` (they finish within milliseconds) with
    those hooks silenced, and collects the abandoned coroutines, so that the one
    warning or error naming the step is all a user sees."""
    hooks = sys.unraisablehook, sys.excepthook
    sys.unraisablehook = lambda unraisable: None
    sys.excepthook = lambda *exc_info: None
    try:
        yield
    except BaseException:
        time.sleep(grace_s)
        gc.collect()
        raise
    finally:
        sys.unraisablehook, sys.excepthook = hooks


class Checkpointer:
    """Saves and restores (state, data states, metadata) per training step."""

    def __init__(self, directory: str, *, keep: int, async_save: bool = True):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        # orbax wants an absolute path; relative ones resolve against the cwd.
        self.directory = os.path.abspath(os.fspath(directory))
        os.makedirs(self.directory, exist_ok=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            # The trainer decides when to save; orbax's interval policy must not skip steps.
            save_interval_steps=1,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state, *, data_states: list[dict], metadata: dict) -> None:
        """Starts writing checkpoint `step`; returns once arrays are copied off device.

        A step that already exists is left as it is (a resume saves its own step again).
        """
        step = int(step)
        if step in self._manager.all_steps():
            return
        args = ocp.args.Composite(
            **{
                _STATE: ocp.args.StandardSave(state),
                _DATA: ocp.args.JsonSave({"data_states": list(data_states)}),
                _METADATA: ocp.args.JsonSave(metadata),
            }
        )
        try:
            # force: save steps below the latest too (orbax would skip them silently).
            self._manager.save(step, args=args, force=True)
        except ocp.checkpoint_manager.StepAlreadyExistsError:
            pass

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def read(self, step: int, read: Callable[[int], T]) -> T:
        """read(step), with any way damaged files fail (a truncated, deleted or overwritten
        file, an emptied folder) raised as one DamagedCheckpointError naming the step."""
        try:
            with _quiet_orphaned_reads():
                return read(step)
        except RuntimeError:  # the device's errors (out of memory, ...): not the files'
            raise
        # orbax and tensorstore fail on damaged files in many ways (a bare Exception,
        # OSError, ValueError, KeyError, JSON errors, ...): this step cannot be used.
        except Exception as error:  # noqa: BLE001
            cause = " ".join(f"{type(error).__name__}: {error}".split())
            cause = cause.split(" See full TensorStore details")[0][:300]
            raise DamagedCheckpointError(step, f"{self.directory}/{step}: {cause}") from None

    def newest(self, read: Callable[[int], T], *, move_aside: bool = True) -> tuple[int, T] | None:
        """(step, read(step)) for the newest step that `read` can read, or None if none.

        A step that fails to read is named in a warning and, with `move_aside`, moved to
        DIR-damaged/ (not deleted) so that the run goes on from the step before it.
        """
        for step in reversed(self.all_steps()):
            try:
                return step, self.read(step, read)
            except DamagedCheckpointError as error:
                where = error.where
                if move_aside and jax.process_index() == 0:
                    aside = os.path.join(f"{self.directory}-damaged", f"{step}-{int(time.time())}")
                    os.makedirs(os.path.dirname(aside), exist_ok=True)
                    shutil.move(f"{self.directory}/{step}", aside)
                    self._manager.reload()
                    where = where.replace(f"/{step}: ", f"/{step} (moved to {aside}): ", 1)
                warnings.warn(f"checkpoint {step} cannot be read, using an earlier one: {where}",
                              stacklevel=2)
        return None

    def restore(self, step: int, abstract_state) -> tuple:
        """(state, data_states, metadata) of `step`, the state placed like `abstract_state`.

        `abstract_state` leaves are `jax.ShapeDtypeStruct`s with shardings, or
        concrete arrays whose shape, dtype and sharding are used; a checkpoint
        written from another layout (one device, replicated, sharded) is
        resharded on read.
        """
        abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self._manager.restore(
            int(step),
            args=ocp.args.Composite(
                **{
                    _STATE: ocp.args.StandardRestore(abstract_state),
                    _DATA: ocp.args.JsonRestore(),
                    _METADATA: ocp.args.JsonRestore(),
                }
            ),
        )
        return restored[_STATE], restored[_DATA]["data_states"], restored[_METADATA]

    def metadata(self, step: int) -> dict:
        """The metadata item of `step` alone; the state is not read."""
        restored = self._manager.restore(
            int(step), args=ocp.args.Composite(**{_METADATA: ocp.args.JsonRestore()})
        )
        return restored[_METADATA]

    def wait(self) -> None:
        """Blocks until every async save is written and old steps are deleted."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and stops orbax's background threads."""
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
