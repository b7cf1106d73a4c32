"""Checkpoints: orbax's `CheckpointManager`, async, keeping the last N steps.

One checkpoint per step holds three items:

    "state"     the training state pytree (StandardSave): params, optimizer
                state, step. A flax `TrainState` can be saved as it is:
                `apply_fn` and `tx` are static fields, not leaves, so they are
                not written and come back from the abstract state on restore.
    "data_iterator"  the training-data iterator's position, for an exact resume:
                grain's own orbax item (`grain.checkpoint.CheckpointSave`), one
                small JSON file per process, each written and read by its process.
    "metadata"  the run config, tokenizer path and model config (JsonSave),
                readable alone so a resume can refuse a different model before
                anything compiles; and the software that wrote it
                (`provenance.software`: versions, the package's git commit).

Inference reads the parameters alone (`restore_params`: an orbax partial restore
of the "state" item), so it needs neither the optimizer nor the run's optim config.

Multi-host: every process calls `save` and `restore` (orbax synchronises them);
the metadata is written by the primary process, each data-iterator file by its own.

A restore tells damage from a mismatch. Damage (a file truncated, deleted or
overwritten, a folder emptied) is a DamagedCheckpointError, and `newest` moves the
step aside and tries the one before. A checkpoint whose files are whole but do not
fit what restores them is a CheckpointMismatchError, never moved aside, which stops
`newest` (the steps before it would not fit either):
    StateMismatchError  the saved state's tree (orbax's item metadata: array paths
                        and shapes) is not the abstract state's, e.g. another
                        optimizer; found before any array is read.
    DataPositionError   the data iterator cannot take the saved position: the step
                        has no data_iterator item (a checkpoint from before it, which
                        held a "data" item), or its file is whole JSON that the
                        iterator refuses (another data.batching or data.num_workers).
                        Restoring without the iterator then restores the state.

orbax 0.12 notes: `reached_preemption` is always False without
`jax.distributed`, so preemption saves are the trainer's job (SIGTERM);
`CheckpointManager.save` first waits for the previous async save to finish.
"""

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import TypeVar

import grain
import jax
import orbax.checkpoint as ocp

from transformer_jax.orbax_noise import QuietOrbax, error_line, settled_on_failure

T = TypeVar("T")

_STATE, _DATA, _METADATA = "state", "data_iterator", "metadata"


class DamagedCheckpointError(Exception):
    """A checkpoint step whose files cannot be read."""

    def __init__(self, step: int, where: str):
        super().__init__(f"checkpoint {step} cannot be read: {where}")
        self.step, self.where = step, where


class CheckpointMismatchError(Exception):
    """A checkpoint step whose files are whole but do not fit what restores them (not damage)."""

    def __init__(self, step: int, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.step, self.where, self.why = step, where, why


class StateMismatchError(CheckpointMismatchError):
    """The saved state's tree is not the abstract state's (another optimizer, say)."""


class DataPositionError(CheckpointMismatchError):
    """The data iterator cannot take the step's saved position (none saved, or another
    kind of iterator's); the state itself may restore."""


class CheckpointWriteError(Exception):
    """A checkpoint could not be written (a full disk, a folder that became unwritable)."""


class NoCheckpointReadsError(Exception):
    """A run's checkpoints, every one of them damaged (and moved aside): it has none to
    resume from, and starting afresh is for the user to choose."""


def _array_shapes(tree) -> dict[str, tuple]:
    """{"opt_state/0/mu/...": shape} of a state tree, an abstract one, or orbax's item
    metadata of a saved one (empty nodes, such as optax's EmptyState, have no entry)."""
    return {"/".join(map(str, path)): tuple(getattr(leaf, "shape", ()))
            for path, leaf in ocp.tree.to_flat_dict(tree).items()}


def _tree_difference(saved: dict[str, tuple], wanted: dict[str, tuple]) -> str:
    """How two `_array_shapes` differ, in a line naming the first array of each kind."""
    extra, missing = sorted(set(saved) - set(wanted)), sorted(set(wanted) - set(saved))
    reshaped = sorted(k for k in set(saved) & set(wanted) if saved[k] != wanted[k])
    parts = []
    if extra:
        parts.append(f"{len(extra)} saved arrays not in the state restored into ({extra[0]}, ...)")
    if missing:
        parts.append(f"{len(missing)} of its arrays not saved ({missing[0]}, ...)")
    if reshaped:
        name = reshaped[0]
        parts.append(f"{name} saved as {saved[name]}, now {wanted[name]}")
    return "its state does not fit: " + "; ".join(parts)


def _is_whole_json(path: str) -> bool:
    """Whether the file at `path` reads and parses as JSON (a torn or zeroed one does not)."""
    try:
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    return True


def _handlers() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    """The handler of each item and argument type. The state item has two readers over one
    format: StandardRestore (the whole state) and PyTreeRestore (a part of it)."""
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for args in (ocp.args.StandardSave, ocp.args.StandardRestore, ocp.args.PyTreeRestore):
        registry.add(_STATE, args)
    registry.add(_DATA, grain.checkpoint.CheckpointSave)
    registry.add(_DATA, grain.checkpoint.CheckpointRestore)
    registry.add(_METADATA, ocp.args.JsonSave)
    registry.add(_METADATA, ocp.args.JsonRestore)
    return registry


def saved_metadata(directory: str) -> tuple[int, dict] | None:
    """(step, metadata) of the newest step under `directory` whose metadata reads, from its
    JSON file, without orbax: its manager syncs a run's processes as it opens, and this is
    read before they meet, for a check that spares work (`refuse_other_vocabulary` before a
    tokenizer is trained). None if there is none. `Checkpointer.newest` is the check that
    counts: it reads through orbax, and moves damaged steps aside."""
    try:
        steps = sorted((int(name) for name in os.listdir(directory) if name.isdigit()),
                       reverse=True)
    except OSError:  # no folder yet, or not one
        return None
    for step in steps:
        try:
            with open(os.path.join(directory, str(step), _METADATA, "metadata"),
                      encoding="utf-8") as f:
                metadata = json.load(f)
        except (OSError, ValueError):  # damaged: Checkpointer.newest says so
            continue
        if isinstance(metadata, dict):
            return step, metadata
    return None


class Checkpointer:
    """Saves and restores (state, data iterator, metadata) per training step."""

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
        QuietOrbax.enter()  # first: the manager reads each step's metadata as it opens
        try:
            self._manager = ocp.CheckpointManager(self.directory, options=options,
                                                  handler_registry=_handlers())
        except BaseException:
            QuietOrbax.exit()
            raise
        self._writing: int | None = None  # the step of the last save started
        self._failed = self._failed_reads = False

    @contextlib.contextmanager
    def _writes(self):
        """A failed write (this one's, or an earlier async save's) as one CheckpointWriteError."""
        try:
            with settled_on_failure():
                yield
        except CheckpointWriteError:  # from a nested wait()
            raise
        except Exception as error:  # noqa: BLE001 (orbax and tensorstore raise many kinds)
            if self._failed:  # reported once; orbax raises it again on every later call
                return
            self._failed = True
            raise CheckpointWriteError(
                f"checkpoint {self._writing} could not be written to {self.directory}: "
                f"{error_line(error)}") from None

    def save(self, step: int, state, *, data_iterator, metadata: dict) -> None:
        """Starts writing checkpoint `step`; returns once arrays are copied off device.

        `data_iterator`: a grain `DatasetIterator` (its `get_state()` is written now).
        A step that already exists is left as it is (a resume saves its own step again).
        """
        step = int(step)
        if step in self._manager.all_steps():
            return
        args = ocp.args.Composite(
            **{
                _STATE: ocp.args.StandardSave(state),
                _DATA: grain.checkpoint.CheckpointSave(data_iterator),
                _METADATA: ocp.args.JsonSave(metadata),
            }
        )
        with self._writes():
            self.wait()  # an earlier async save's failure is reported under its own step
            self._writing = step
            # A folder that became unwritable (a disk remounted read-only): orbax's thread
            # fails to make the step's folder, and its caller waits 300 s for it, then names
            # no OS error. A file made and removed first says it at once.
            os.makedirs(self.directory, exist_ok=True)  # deleted meanwhile: as orbax would
            with tempfile.TemporaryFile(dir=self.directory):
                pass
            try:
                # force: save steps below the latest too (orbax would skip them silently).
                self._manager.save(step, args=args, force=True)
            except ocp.checkpoint_manager.StepAlreadyExistsError:
                pass

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self, *, reload: bool = False) -> list[int]:
        """The steps saved, oldest first; with `reload`, read from the folder again (a run
        saving beside this process may have added and removed some)."""
        if reload:
            self._manager.reload()
        return sorted(self._manager.all_steps())

    def read(self, step: int, read: Callable[[int], T]) -> T:
        """read(step), with any way damaged files fail (a truncated, deleted or overwritten
        file, an emptied folder) raised as one DamagedCheckpointError naming the step.
        A CheckpointMismatchError (whole files that do not fit) passes as it is."""
        try:
            with settled_on_failure():
                return read(step)
        except (RuntimeError, CheckpointMismatchError):  # the device's errors (out of
            raise  # memory, ...) and whole files that do not fit: not the files' damage
        # orbax and tensorstore fail on damaged files in many ways (a bare Exception,
        # OSError, ValueError, KeyError, JSON errors, ...): this step cannot be used.
        except Exception as error:  # noqa: BLE001
            self._failed_reads = True
            raise DamagedCheckpointError(
                step, f"{self.directory}/{step}: {error_line(error)}") from None

    def newest(self, read: Callable[[int], T], *, move_aside: bool = True) -> tuple[int, T] | None:
        """(step, read(step)) for the newest step that `read` can read, or None if none.

        A step that fails to read is named in a warning and, with `move_aside`, moved to
        DIR-damaged/ (not deleted) so that the run goes on from the step before it; every
        step moved so is a NoCheckpointReadsError, not None (a run would start afresh).
        A CheckpointMismatchError is raised as it is: nothing is moved, no earlier step tried.
        """
        steps = self.all_steps()
        for step in reversed(steps):
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
                then = "using an earlier one" if step != steps[0] else "and it is the earliest"
                warnings.warn(f"checkpoint {step} cannot be read, {then}: {where}", stacklevel=2)
        if steps and move_aside:
            raise NoCheckpointReadsError(
                f"no checkpoint of {self.directory} can be read (steps "
                f"{', '.join(map(str, steps))}, moved to {self.directory}-damaged/; the "
                f"warnings above say why): nothing to resume from. Restore one from a copy, or "
                f"run again to train afresh from step 1, which replaces the run's "
                f"metrics.jsonl records")
        return None

    def restore(self, step: int, abstract_state, data_iterator=None) -> tuple:
        """(state, metadata) of `step`, the state placed like `abstract_state`; with a
        `data_iterator`, also moves it to the saved position (in place).

        `abstract_state` leaves are `jax.ShapeDtypeStruct`s with shardings, or
        concrete arrays whose shape, dtype and sharding are used; a checkpoint
        written from another layout (one device, replicated, sharded) is
        resharded on read. Only this process's data-iterator file is read.

        Raises StateMismatchError, before any array is read, when the saved tree is not
        `abstract_state`'s; DataPositionError, before the state is read, when the
        iterator cannot take the saved position (restore without it to get the state).
        """
        abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        self._check_state_tree(step, abstract_state)
        if data_iterator is not None:
            self._restore_position(step, data_iterator)
        items = {_STATE: ocp.args.StandardRestore(abstract_state),
                 _METADATA: ocp.args.JsonRestore()}
        restored = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        return restored[_STATE], restored[_METADATA]

    def _check_state_tree(self, step: int, abstract_state) -> None:
        """StateMismatchError unless `step`'s saved state has the arrays (paths, shapes) of
        `abstract_state`; reads orbax's item metadata only. Dtypes may differ (orbax casts)."""
        saved = self._manager.item_metadata(int(step)).get(_STATE)
        if saved is None:  # an emptied folder: damage, raised as such by `read`
            raise FileNotFoundError(f"no {_STATE} item")
        saved, wanted = _array_shapes(saved.tree), _array_shapes(abstract_state)
        if saved != wanted:
            raise StateMismatchError(step, f"{self.directory}/{step}",
                                     _tree_difference(saved, wanted))

    def _restore_position(self, step: int, data_iterator) -> None:
        """Moves `data_iterator` to `step`'s saved position, or raises DataPositionError:
        no data_iterator item (a checkpoint of an older version), positions saved by
        another number of processes (each process saves its own), or a whole JSON file the
        iterator refuses (another kind of iterator's). A missing or broken file is damage."""
        where = f"{self.directory}/{step}"
        if not os.path.isdir(os.path.join(where, _DATA)):
            raise DataPositionError(step, where, f"it has no {_DATA} item (it is from an "
                                                 f"older version)")
        if counts := self._other_process_counts(step):
            saved = " and ".join(map(str, counts)) + (" process" if counts == [1] else
                                                       " processes")
            raise DataPositionError(step, where, f"its data positions were saved by {saved}, "
                                                 f"this run has {jax.process_count()}")
        try:
            self._manager.restore(int(step), args=ocp.args.Composite(
                **{_DATA: grain.checkpoint.CheckpointRestore(data_iterator)}))
        except Exception as error:  # noqa: BLE001 (grain's set_state raises KeyError, ...)
            if not _is_whole_json(self._position_file(step)):
                raise
            raise DataPositionError(step, where, f"the data iterator cannot take its saved "
                                                 f"position ({error_line(error)})") from None

    def _other_process_counts(self, step: int) -> list[int]:
        """The process counts of `step`'s data-position files when none is this run's
        (`_position_file`'s name: "process_K-of-N.json"); [] when this run's is there."""
        folder = os.path.dirname(self._position_file(step))
        counts = {int(match[1]) for name in os.listdir(folder)
                  if (match := re.fullmatch(r"process_\d+-of-(\d+)\.json", name))}
        return [] if jax.process_count() in counts else sorted(counts)

    def _position_file(self, step: int) -> str:
        """This process's data-iterator file of `step`, as grain's handler names it."""
        name = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
        return os.path.join(self.directory, str(step), _DATA, name)

    def restore_params(self, step: int, abstract_params):
        """The `params` of `step`'s state alone: the optimizer state is not read.

        `abstract_params` gives the tree, shapes and dtypes (`train_state.abstract_params`);
        leaves without a sharding are placed on the first local device. Whatever
        optimizer wrote the checkpoint, its state stays on disk (orbax's partial restore).
        """
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

        def placed(x):
            return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                        sharding=getattr(x, "sharding", None) or device)

        # Only the "params" subtree is named: the step and the optimizer state are omitted.
        item = {"params": jax.tree.map(placed, abstract_params)}
        args = ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
            partial_restore=True)
        restored = self._manager.restore(int(step), args=ocp.args.Composite(**{_STATE: args}))
        return restored[_STATE]["params"]

    def metadata(self, step: int) -> dict:
        """The metadata item of `step` alone; the state is not read."""
        restored = self._manager.restore(
            int(step), args=ocp.args.Composite(**{_METADATA: ocp.args.JsonRestore()})
        )
        return restored[_METADATA]

    def wait(self) -> None:
        """Blocks until every async save is written and old steps are deleted; a save that
        failed raises CheckpointWriteError (once)."""
        with self._writes():
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and stops orbax's background threads."""
        try:
            with self._writes():
                self._manager.close()
        finally:
            # After a failure, orbax's abandoned reads or writes may end later still (later
            # on a loaded machine): their noise stays filtered for the rest of the process.
            if not (self._failed or self._failed_reads):
                QuietOrbax.exit()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
