"""Checkpointer: round trips, retention, async visibility, resharding on restore, and the
parameters restored alone."""

import gc
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import warnings

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from run_configs import biggest_array_file
from transformer_jax.checkpoint import (
    Checkpointer,
    CheckpointWriteError,
    DamagedCheckpointError,
    DataPositionError,
    NoCheckpointReadsError,
    StateMismatchError,
    saved_metadata,
)
from transformer_jax.orbax_noise import QuietOrbax, settled_on_failure

DATA_POSITION = 7  # the training-data iterator has given this many elements
METADATA = {"config": {"lr": 0.5, "layers": [6, 6]}, "tokenizer": "/tmp/spm.model"}

# The states saved here take optax Adam steps directly (see conftest.py).
pytestmark = pytest.mark.usefixtures("standard_dtype_promotion")


@pytest.fixture
def open_checkpointer(tmp_path):
    """Opens Checkpointers on tmp_path and closes every one, so no save thread outlives a test."""
    opened = []

    def open_(keep=3, async_save=True, directory=None):
        directory = str(directory or tmp_path / "ckpt")
        checkpointer = Checkpointer(directory, keep=keep, async_save=async_save)
        opened.append(checkpointer)
        return checkpointer

    yield open_
    for checkpointer in opened:
        checkpointer.close()
    assert not [t for t in threading.enumerate() if t.name == "save_finalize"]


def make_state(seed=0):
    key_w, key_b = jax.random.split(jax.random.key(seed))
    params = {
        "w": jax.random.normal(key_w, (4, 3)),
        "b": jax.random.normal(key_b, (3,)).astype(jnp.bfloat16),
    }
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-3))
    # A few updates so the optimizer moments and step are not their initial values.
    for _ in range(2):
        grads = jax.tree.map(jnp.ones_like, state.params)
        state = state.apply_gradients(grads=grads)
    return state


def abstract_leaf(x):
    """A ShapeDtypeStruct with the array's sharding; Python scalars stay as they are."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x


def assert_trees_equal(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert np.asarray(a).dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def data_iterator(position: int = 0):
    """A grain iterator over 0, 1, 2, ... that has given `position` elements."""
    iterator = iter(grain.MapDataset.range(1000).to_iter_dataset())
    for _ in range(position):
        next(iterator)
    return iterator


def save_small(checkpointer, step, state=None):
    state = make_state() if state is None else state
    checkpointer.save(step, state, data_iterator=data_iterator(DATA_POSITION), metadata=METADATA)


def test_saved_metadata_is_the_newest_step_whose_metadata_reads(open_checkpointer, tmp_path):
    """Read without orbax, as orbax wrote it: the newest step's metadata, or the step
    before it when the newest's file is damaged; None with no step, or no folder."""
    assert saved_metadata(str(tmp_path / "ckpt")) is None
    checkpointer = open_checkpointer(async_save=False)
    assert saved_metadata(checkpointer.directory) is None
    save_small(checkpointer, 2)
    checkpointer.save(4, make_state(), data_iterator=data_iterator(),
                      metadata={**METADATA, "step": 4})
    assert saved_metadata(checkpointer.directory) == (4, {**METADATA, "step": 4})
    (tmp_path / "ckpt" / "4" / "metadata" / "metadata").write_text('{"config": {"lr"')
    assert saved_metadata(checkpointer.directory) == (2, METADATA)


def test_train_state_round_trip(open_checkpointer):
    state = make_state()
    assert int(state.step) == 2
    checkpointer = open_checkpointer()
    save_small(checkpointer, 2, state)
    checkpointer.wait()
    abstract = jax.tree.map(abstract_leaf, state)
    fresh = data_iterator()
    restored, metadata = checkpointer.restore(2, abstract, fresh)
    assert isinstance(restored, train_state.TrainState)
    assert_trees_equal(restored, state)
    assert isinstance(restored.step, int)  # TrainState.create's Python int step stays an int
    assert restored.tx is state.tx  # static fields come from the abstract state
    assert next(fresh) == DATA_POSITION  # the iterator continues where the saved one was
    assert metadata == METADATA
    # grain's own item: one file for this process, holding the position.
    (saved,) = pathlib.Path(checkpointer.directory, "2", "data_iterator").glob("process_*")
    assert saved.name == "process_0-of-1.json"


def test_a_checkpoint_without_the_data_iterator_item_is_a_data_position_error(tmp_path):
    """A checkpoint of an older version (a JSON "data" item instead of grain's): restoring
    into an iterator raises DataPositionError, before the state is read, and leaves the
    iterator at its start; restoring without one gives the state."""
    state = {"w": jnp.arange(6.0), "step": jnp.int32(3)}
    old = ocp.CheckpointManager(str(tmp_path))
    old.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                        data=ocp.args.JsonSave({"data_states": [{"a": 1}]}),
                                        metadata=ocp.args.JsonSave(METADATA)))
    old.wait_until_finished()
    old.close()
    with Checkpointer(str(tmp_path), keep=3) as checkpointer:
        fresh = data_iterator()
        with pytest.raises(DataPositionError, match=r"/3: it has no data_iterator item"):
            checkpointer.newest(lambda step: checkpointer.restore(step, state, fresh))
        restored, metadata = checkpointer.restore(3, state)
    assert_trees_equal(restored, state)
    assert metadata == METADATA and next(fresh) == 0


def test_restore_from_concrete_arrays(open_checkpointer):
    checkpointer = open_checkpointer()
    state = make_state(seed=1)
    save_small(checkpointer, 1, state)
    checkpointer.wait()
    # Zeros in place of every array; same tx, so the tree structures compare equal.
    target = jax.tree.map(lambda x: jnp.zeros_like(x) if isinstance(x, jax.Array) else 0, state)
    restored, _ = checkpointer.restore(1, target)
    assert_trees_equal(restored, state)


def test_keep_last_two(open_checkpointer):
    checkpointer = open_checkpointer(keep=2)
    state = make_state()
    for step in range(1, 5):
        save_small(checkpointer, step, state)
    checkpointer.wait()
    assert checkpointer.all_steps() == [3, 4]
    assert checkpointer.latest_step() == 4


def test_latest_step_empty_directory(open_checkpointer):
    checkpointer = open_checkpointer()
    assert checkpointer.latest_step() is None
    assert checkpointer.all_steps() == []


def test_async_save_visible_to_new_checkpointer(open_checkpointer, tmp_path):
    writer = open_checkpointer(async_save=True)
    save_small(writer, 5)
    writer.wait()
    reader = open_checkpointer()
    assert reader.latest_step() == 5
    assert reader.metadata(5) == METADATA


def test_sync_save(open_checkpointer):
    checkpointer = open_checkpointer(async_save=False)
    save_small(checkpointer, 3)
    assert open_checkpointer().latest_step() == 3


def test_save_same_step_twice_is_a_no_op(open_checkpointer):
    checkpointer = open_checkpointer()
    first = make_state(seed=1)
    save_small(checkpointer, 1, first)
    save_small(checkpointer, 1, make_state(seed=2))  # before the first write is done
    checkpointer.wait()
    save_small(checkpointer, 1, make_state(seed=3))  # after it
    checkpointer.wait()
    assert checkpointer.all_steps() == [1]
    restored, _ = checkpointer.restore(1, first)
    assert_trees_equal(restored, first)


def test_save_below_latest_step(open_checkpointer):
    checkpointer = open_checkpointer()
    save_small(checkpointer, 5)
    save_small(checkpointer, 2)
    checkpointer.wait()
    assert checkpointer.all_steps() == [2, 5]


def test_metadata_reads_only_metadata(open_checkpointer, tmp_path):
    checkpointer = open_checkpointer()
    save_small(checkpointer, 1)
    checkpointer.wait()
    # Were the state read, its missing files would make this fail.
    state_dir = tmp_path / "ckpt" / "1" / "state"
    assert state_dir.is_dir()
    state_dir.rename(tmp_path / "moved_state")
    assert open_checkpointer().metadata(1) == METADATA


def test_restore_params_reads_the_parameters_alone(open_checkpointer, tmp_path):
    """`restore_params` needs no optimizer: it returns the saved parameters on the first
    device, and still does once the optimizer state's data file is deleted, which the
    whole state's restore then cannot read."""
    params = make_state(seed=3).params
    opt_state = optax.GradientTransformation(  # one large array: a data file of its own
        lambda p: {"moments": jnp.arange(300_000.0)}, lambda u, s, p=None: (u, s))
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=opt_state)
    checkpointer = open_checkpointer()
    save_small(checkpointer, 1, state)
    checkpointer.wait()
    abstract_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    restored = checkpointer.restore_params(1, abstract_params)
    assert_trees_equal(restored, params)
    assert {leaf.sharding for leaf in jax.tree.leaves(restored)} == {
        jax.sharding.SingleDeviceSharding(jax.local_devices()[0])}
    assert_trees_equal(checkpointer.restore(1, state)[0], state)  # both readers, one manager
    biggest_array_file(tmp_path / "ckpt" / "1").unlink()
    reader = open_checkpointer()
    with pytest.raises(DamagedCheckpointError):
        reader.read(1, lambda step: reader.restore(step, state))
    assert_trees_equal(reader.restore_params(1, abstract_params), params)


def replicated_sharding():
    mesh = Mesh(np.array(jax.devices("cpu")), ("data",))  # conftest's 8, beside any GPU
    return NamedSharding(mesh, PartitionSpec())


def test_restore_replicated_into_replicated(open_checkpointer):
    assert replicated_sharding().mesh.size == 8
    sharding = replicated_sharding()
    state = jax.device_put({"w": jnp.arange(24.0).reshape(8, 3), "step": jnp.int32(4)}, sharding)
    checkpointer = open_checkpointer()
    checkpointer.save(4, state, data_iterator=data_iterator(), metadata=METADATA)
    checkpointer.wait()
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)
    restored, _ = checkpointer.restore(4, abstract)
    assert_trees_equal(restored, state)
    for leaf in jax.tree.leaves(restored):
        assert leaf.sharding == sharding
        assert len(leaf.addressable_shards) == 8


def test_restore_single_device_into_replicated_and_sharded(open_checkpointer):
    state = {"w": jnp.arange(24.0).reshape(8, 3), "b": jnp.ones((3,), jnp.bfloat16)}
    assert len(state["w"].devices()) == 1
    checkpointer = open_checkpointer()
    checkpointer.save(1, state, data_iterator=data_iterator(), metadata=METADATA)
    checkpointer.wait()
    replicated = replicated_sharding()
    row_sharded = NamedSharding(replicated.mesh, PartitionSpec("data"))
    shardings = {"w": row_sharded, "b": replicated}
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )
    restored, _ = checkpointer.restore(1, abstract)
    assert_trees_equal(restored, state)
    assert restored["w"].sharding == row_sharded
    assert restored["b"].sharding == replicated
    assert restored["w"].addressable_shards[0].data.shape == (1, 3)


def test_donating_state_right_after_async_save_keeps_saved_values(open_checkpointer):
    # orbax takes host copies (on CPU: views that keep the buffers alive, so jax may
    # refuse the donation) before save returns, so the trainer may donate the state.
    state = {f"w{i}": jnp.full((512, 512), float(i)) for i in range(4)}
    expected = jax.tree.map(np.array, state)
    overwrite = jax.jit(lambda tree: jax.tree.map(lambda x: -x, tree), donate_argnums=0)
    checkpointer = open_checkpointer()
    checkpointer.save(1, state, data_iterator=data_iterator(), metadata=METADATA)
    new_state = jax.block_until_ready(overwrite(state))
    checkpointer.wait()
    restored, _ = checkpointer.restore(1, new_state)
    assert_trees_equal(restored, expected)


def _empty(folder):
    for child in folder.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


DAMAGE = {
    "truncated array file": lambda d: biggest_array_file(d).write_bytes(
        biggest_array_file(d).read_bytes()[:100]),
    "deleted array file": lambda d: biggest_array_file(d).unlink(),
    "overwritten array file": lambda d: biggest_array_file(d).write_bytes(b"\0" * 4096),
    "truncated metadata item": lambda d: (d / "metadata" / "metadata").write_text("{"),
    "deleted data-iterator file": lambda d: (d / "data_iterator" / "process_0-of-1.json").unlink(),
    "overwritten data-iterator file": lambda d: (
        d / "data_iterator" / "process_0-of-1.json").write_text("[]]"),
    "truncated array manifest": lambda d: (d / "state" / "manifest.ocdbt").write_bytes(b"x"),
    "emptied step folder": _empty,
}


def large_state(step):
    """Arrays too large for orbax to inline in its index: each has a data file to damage."""
    return {"w": jnp.arange(3000.0) * step, "b": jnp.full((40, 50), step, jnp.bfloat16)}


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """Checkpoints 2 and 4 of large_state(2) and large_state(4), written once per module."""
    directory = tmp_path_factory.mktemp("two") / "ckpt"
    with Checkpointer(str(directory), keep=3) as checkpointer:
        for step in (2, 4):
            checkpointer.save(step, large_state(step), data_iterator=data_iterator(step),
                              metadata={"step": step})
    return directory


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_step_is_moved_aside_and_the_one_before_restores(
        damage, two_steps, tmp_path, open_checkpointer):
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    DAMAGE[damage](directory / "4")
    checkpointer = open_checkpointer(directory=directory)
    with pytest.warns(UserWarning, match=r"checkpoint 4 cannot be read, using an earlier one: "
                                         r".*ckpt/4 \(moved to .*ckpt-damaged/4-\d+\)") as caught:
        fresh = data_iterator()
        step, (state, metadata) = checkpointer.newest(
            lambda s: checkpointer.restore(s, large_state(0), fresh))
    assert len([w for w in caught if "cannot be read" in str(w.message)]) == 1
    assert (step, next(fresh), metadata) == (2, 2, {"step": 2})
    assert_trees_equal(state, large_state(2))
    assert checkpointer.all_steps() == [2] and not (directory / "4").exists()
    (aside,) = (tmp_path / "ckpt-damaged").iterdir()  # kept, not deleted
    assert aside.name.startswith("4-")


def test_readers_fall_back_without_moving_and_none_is_none(two_steps, tmp_path, open_checkpointer):
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    DAMAGE["deleted array file"](directory / "4")
    checkpointer = open_checkpointer(directory=directory)
    with pytest.warns(UserWarning, match=r"checkpoint 4 cannot be read.*ckpt/4: Exception"):
        assert checkpointer.newest(checkpointer.metadata, move_aside=False)[0] == 4
        assert checkpointer.newest(lambda s: checkpointer.restore(s, large_state(0)),
                                   move_aside=False)[0] == 2
    assert (directory / "4").exists() and not (tmp_path / "ckpt-damaged").exists()
    with pytest.warns(UserWarning):
        assert checkpointer.newest(lambda s: 1 / 0, move_aside=False) is None


def test_a_stop_signal_during_a_read_is_not_damage(two_steps, tmp_path, open_checkpointer):
    """A stop signal raised while a step is read (StoppedAtOnce: a BaseException, as
    KeyboardInterrupt is) passes through the reader: the step stays, nothing is moved aside."""
    from transformer_jax.stop_signal import StoppedAtOnce

    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    checkpointer = open_checkpointer(directory=directory)

    def stopped_while_reading(step):
        checkpointer.restore(step, large_state(0))
        raise StoppedAtOnce("SIGTERM before the first step: stopped at once", signal.SIGTERM)

    with pytest.raises(StoppedAtOnce):
        checkpointer.newest(stopped_while_reading)
    assert checkpointer.all_steps() == [2, 4] and not (tmp_path / "ckpt-damaged").exists()


FULL_DISK = """
import resource, signal, sys
import grain
import jax.numpy as jnp
from transformer_jax.checkpoint import Checkpointer, CheckpointWriteError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails as on a full disk
checkpointer = Checkpointer(sys.argv[1], keep=3)
state = {f"w{i}": jnp.arange(100_000.0) + i for i in range(8)}
data = lambda: iter(grain.MapDataset.range(3).to_iter_dataset())
checkpointer.save(1, state, data_iterator=data(), metadata={})
checkpointer.wait()
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
try:
    checkpointer.save(2, state, data_iterator=data(), metadata={})
    checkpointer.save(3, state, data_iterator=data(), metadata={})  # reports step 2's failure
except CheckpointWriteError as error:
    print(f"error: {error}", file=sys.stderr)
finally:
    checkpointer.close()
"""


def test_a_failed_write_is_one_line_and_loses_nothing_saved(tmp_path, open_checkpointer):
    """A full disk mid-run (files limited to 20 kB): the async save's failure reaches the
    next call as one CheckpointWriteError naming its step and the OS error, none of orbax's
    tracebacks are printed, and the step saved before restores."""
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=120)  # pipes: no size limit
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: checkpoint 2 could not be written to {tmp_path / 'ckpt'}: ")
    assert "File too large" in lines[0]
    checkpointer = open_checkpointer(directory=tmp_path / "ckpt")
    assert checkpointer.all_steps() == [1]
    state, _ = checkpointer.restore(1, {f"w{i}": jnp.zeros(100_000) for i in range(8)})
    np.testing.assert_array_equal(np.asarray(state["w3"]), np.arange(100_000.0) + 3)


def test_a_checkpoints_folder_made_read_only_is_one_error_at_once(tmp_path, open_checkpointer):
    """The folder remounted read-only mid-run (ext4 after a disk error does so; here a
    read-only bind mount): the next save is a CheckpointWriteError naming the step and
    the OS error at once (saving a step that is there already still writes nothing, and
    does not fail). orbax's thread failed to make the step's folder while the save waited
    300 s for it, then named no OS error. Needs mount(8) and the right to mount."""
    checkpointer = open_checkpointer(directory=tmp_path / "ckpt")
    save_small(checkpointer, 1)
    checkpointer.wait()
    folder = str(tmp_path / "ckpt")
    mounted = subprocess.run(f"mount --bind {folder} {folder} && "
                             f"mount -o remount,ro,bind {folder}", shell=True,
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        subprocess.run(["umount", folder], capture_output=True)
        pytest.skip(f"cannot mount a read-only folder here: {mounted.stderr.strip()}")
    try:
        save_small(checkpointer, 1)  # a step that exists is left as it is: nothing to write
        with pytest.raises(CheckpointWriteError) as error:
            save_small(checkpointer, 2)
        assert str(error.value).startswith(f"checkpoint 2 could not be written to {folder}: ")
        assert "Read-only file system" in str(error.value)
    finally:
        subprocess.run(["umount", folder], check=True)
    assert checkpointer.all_steps() == [1]


def test_a_state_of_another_optimizer_is_a_mismatch_found_before_any_array_is_read(
        tmp_path, open_checkpointer):
    """Adam's state saved, restored into clipping + Adam (optax.chain: one stage more, its
    state a tuple around Adam's): a StateMismatchError naming the first array of each side,
    raised by `newest` as it is: nothing moved aside, no earlier step tried. Found from
    orbax's item metadata: with an array file deleted, it is still the mismatch."""
    checkpointer = open_checkpointer(directory=tmp_path / "ckpt")
    for step in (2, 4):
        save_small(checkpointer, step, make_state())
    checkpointer.wait()
    biggest_array_file(tmp_path / "ckpt" / "4").unlink()
    clipped = train_state.TrainState.create(
        apply_fn=None, params=make_state().params,
        tx=optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)))
    fresh = data_iterator()
    with pytest.raises(StateMismatchError) as caught:
        checkpointer.newest(lambda s: checkpointer.restore(s, clipped, fresh))
    # Adam's count, mu (b, w) and nu (b, w): 5 arrays, under opt_state/0 saved, now under
    # opt_state/1/0 (the chain's empty clipping state has no array).
    assert str(caught.value) == (
        f"{tmp_path / 'ckpt'}/4: its state does not fit: 5 saved arrays not in the state "
        f"restored into (opt_state/0/count, ...); 5 of its arrays not saved "
        f"(opt_state/1/0/count, ...)")
    assert caught.value.step == 4 and next(fresh) == 0  # the iterator was not moved either
    assert checkpointer.all_steps() == [2, 4] and not (tmp_path / "ckpt-damaged").exists()


def test_a_reshaped_array_is_a_mismatch(two_steps, open_checkpointer):
    checkpointer = open_checkpointer(directory=two_steps)
    wanted = {**large_state(0), "w": jnp.zeros(10)}
    with pytest.raises(StateMismatchError, match=r"/4: its state does not fit: w saved as "
                                                 r"\(3000,\), now \(10,\)$"):
        checkpointer.read(4, lambda s: checkpointer.restore(s, wanted))


def test_positions_saved_by_another_number_of_processes_are_a_data_position_error(
        two_steps, tmp_path, open_checkpointer):
    """Each process saves its own data position (process_K-of-N.json): a run of another
    process count finds none of its own. That is a DataPositionError (the trainer goes on
    from the state with a new shuffle), not damage: nothing is moved aside."""
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    positions = directory / "4" / "data_iterator"
    (positions / "process_0-of-1.json").rename(positions / "process_0-of-2.json")
    shutil.copy(positions / "process_0-of-2.json", positions / "process_1-of-2.json")
    checkpointer = open_checkpointer(directory=directory)
    with pytest.raises(DataPositionError) as caught:
        checkpointer.newest(lambda s: checkpointer.restore(s, large_state(0), data_iterator()))
    assert caught.value.step == 4
    assert caught.value.why == "its data positions were saved by 2 processes, this run has 1"
    assert checkpointer.all_steps() == [2, 4] and not (tmp_path / "ckpt-damaged").exists()
    step, (state, _) = checkpointer.newest(lambda s: checkpointer.restore(s, large_state(0)))
    assert step == 4
    assert_trees_equal(state, large_state(4))


def mixed_iterator():
    """A grain iterator of another kind than `data_iterator`'s (a mix of two): its state
    is {"parents": [...], "index": ..., "stop": ...}, not {"next_index": ...}."""
    dataset = grain.MapDataset.range(1000).to_iter_dataset()
    return iter(grain.IterDataset.mix([dataset, dataset], [0.5, 0.5]))


def test_an_iterator_of_another_kind_is_a_data_position_error_not_damage(
        two_steps, tmp_path, open_checkpointer):
    """A whole data-iterator file that the iterator refuses (a range's position restored
    into a mix: as a resume with another data.batching or data.num_workers): a
    DataPositionError, nothing moved aside; without the iterator, the state restores.
    (A missing or broken file is damage: DAMAGE above.)"""
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    checkpointer = open_checkpointer(directory=directory)
    with pytest.raises(DataPositionError) as caught:
        checkpointer.newest(lambda s: checkpointer.restore(s, large_state(0), mixed_iterator()))
    assert caught.value.step == 4
    assert caught.value.why == ("the data iterator cannot take its saved position "
                                "(KeyError: 'parents')")
    assert checkpointer.all_steps() == [2, 4] and not (tmp_path / "ckpt-damaged").exists()
    step, (state, metadata) = checkpointer.newest(
        lambda s: checkpointer.restore(s, large_state(0)))
    assert (step, metadata) == (4, {"step": 4})
    assert_trees_equal(state, large_state(4))


def test_keep_below_one_is_refused_before_any_folder_is_made(tmp_path):
    with pytest.raises(ValueError, match=r"^keep must be at least 1, got 0$"):
        Checkpointer(str(tmp_path / "ckpt"), keep=0)
    assert not (tmp_path / "ckpt").exists()


def test_saved_metadata_passes_over_a_step_whose_metadata_is_not_an_object(
        open_checkpointer, tmp_path):
    """Whole JSON that is not a metadata dict (a list, a number) is not a step's metadata:
    the step before it is the newest whose metadata reads."""
    checkpointer = open_checkpointer(async_save=False)
    save_small(checkpointer, 2)
    save_small(checkpointer, 4)
    (tmp_path / "ckpt" / "4" / "metadata" / "metadata").write_text("[1, 2]")
    assert saved_metadata(checkpointer.directory) == (2, METADATA)


def test_saved_metadata_passes_over_folders_that_are_not_steps(open_checkpointer, tmp_path):
    """An interrupted save leaves orbax's temporary folder ("6.orbax-checkpoint-tmp-...")
    beside the steps; other names are not steps either."""
    checkpointer = open_checkpointer(async_save=False)
    save_small(checkpointer, 2)
    (tmp_path / "ckpt" / "6.orbax-checkpoint-tmp-1764000000" / "metadata").mkdir(parents=True)
    (tmp_path / "ckpt" / "6.orbax-checkpoint-tmp-1764000000" / "metadata" / "metadata"
     ).write_text('{"step": 6}')
    (tmp_path / "ckpt" / "notes").mkdir()
    assert saved_metadata(checkpointer.directory) == (2, METADATA)


@pytest.mark.parametrize(("files", "process_count", "why"), [
    (["process_0-of-1.json"], 2, "its data positions were saved by 1 process, this run has 2"),
    (["process_0-of-3.json", "process_0-of-2.json", "process_1-of-2.json"], 1,
     "its data positions were saved by 2 and 3 processes, this run has 1"),
])
def test_a_data_position_error_names_the_process_counts_that_saved_positions(
        files, process_count, why, two_steps, tmp_path, open_checkpointer, monkeypatch):
    """Positions saved by one process (singular), or by runs of several counts (each named
    once, in order), none of them this run's."""
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    positions = directory / "4" / "data_iterator"
    saved = (positions / "process_0-of-1.json").read_text()
    (positions / "process_0-of-1.json").unlink()
    for name in files:
        (positions / name).write_text(saved)
    checkpointer = open_checkpointer(directory=directory)
    monkeypatch.setattr(jax, "process_count", lambda: process_count)
    with pytest.raises(DataPositionError) as caught:
        checkpointer.restore(4, large_state(0), data_iterator())
    assert caught.value.why == why
    assert str(caught.value) == f"{directory}/4: {why}"


def test_newest_of_an_empty_folder_is_none(open_checkpointer, tmp_path):
    """No step at all is a fresh run, not a run whose steps are all damaged."""
    checkpointer = open_checkpointer()
    assert checkpointer.newest(checkpointer.metadata) is None
    assert not (tmp_path / "ckpt-damaged").exists()


def test_every_step_damaged_is_moved_aside_and_an_error_not_none(
        two_steps, tmp_path, open_checkpointer):
    """Each step warned of, newest first (the earliest saying so) and moved aside; then
    NoCheckpointReadsError naming them, so that the run does not start afresh."""
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    for step in (2, 4):
        DAMAGE["deleted array file"](directory / str(step))
    checkpointer = open_checkpointer(directory=directory)
    with pytest.warns(UserWarning) as caught, pytest.raises(NoCheckpointReadsError) as error:
        checkpointer.newest(lambda s: checkpointer.restore(s, large_state(0)))
    said = [str(w.message).split(":")[0] for w in caught if "cannot be read" in str(w.message)]
    assert said == ["checkpoint 4 cannot be read, using an earlier one",
                    "checkpoint 2 cannot be read, and it is the earliest"]
    assert str(error.value).startswith(
        f"no checkpoint of {directory} can be read (steps 2, 4, moved to {directory}-damaged/; ")
    assert checkpointer.all_steps() == []
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "ckpt-damaged").iterdir()) == [
        "2", "4"]


def test_a_runtime_error_while_reading_is_not_damage(two_steps, tmp_path, open_checkpointer):
    """The device's errors (out of memory, ...) are RuntimeErrors: they pass through the
    reader as they are, and the step stays where it is."""
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    checkpointer = open_checkpointer(directory=directory)

    def out_of_memory(step):
        raise RuntimeError(f"RESOURCE_EXHAUSTED: out of memory restoring step {step}")

    with pytest.raises(RuntimeError, match=r"^RESOURCE_EXHAUSTED: out of memory restoring step 4$"):
        checkpointer.newest(out_of_memory)
    assert checkpointer.all_steps() == [2, 4] and not (tmp_path / "ckpt-damaged").exists()


def test_orbax_noise_stays_filtered_after_a_checkpointer_that_failed_a_read_closes(
        two_steps, tmp_path):
    """A clean Checkpointer gives back Python's hooks as it closes; one that failed to read a
    step keeps them filtering (orbax's abandoned reads may end later still)."""
    before = QuietOrbax.users
    with Checkpointer(str(two_steps), keep=3) as checkpointer:
        assert QuietOrbax.users == before + 1
        checkpointer.metadata(4)
    assert QuietOrbax.users == before
    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    DAMAGE["deleted array file"](directory / "4")
    with Checkpointer(str(directory), keep=3) as checkpointer:
        with pytest.raises(DamagedCheckpointError):
            checkpointer.read(4, lambda s: checkpointer.restore(s, large_state(0)))
    assert QuietOrbax.users == before + 1


def test_a_failed_reads_coroutines_that_never_started_are_freed_without_a_warning():
    """orbax raises on one array while it has made the others' read coroutines; one made but
    not yet started warns "coroutine ... was never awaited" when the collector frees it
    (a RuntimeWarning on stderr, under the one-line error). settled_on_failure frees them
    without it, and raises the error."""
    async def read_array():
        pass

    gc.disable()  # the coroutine is freed by settled_on_failure's collection, not before
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(OSError, match="^one array failed$"):
                with settled_on_failure(grace_s=0):
                    abandoned = {"read": read_array()}
                    abandoned["self"] = abandoned  # a cycle: only the collector frees it
                    del abandoned
                    raise OSError("one array failed")
    finally:
        gc.enable()
    assert [str(w.message) for w in caught] == []


def test_restore_params_places_parameters_as_their_shardings_say(open_checkpointer):
    """Leaves given a sharding are placed so (the first device is for those without one)."""
    params = make_state(seed=3).params
    checkpointer = open_checkpointer()
    save_small(checkpointer, 1, make_state(seed=3))
    checkpointer.wait()
    replicated = replicated_sharding()
    abstract = {"w": jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=replicated),
                "b": jax.ShapeDtypeStruct((3,), jnp.bfloat16)}
    restored = checkpointer.restore_params(1, abstract)
    assert_trees_equal(restored, params)
    assert restored["w"].sharding == replicated and len(restored["w"].addressable_shards) == 8
    assert restored["b"].sharding == jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def test_all_steps_reload_sees_the_steps_another_checkpointer_saved(open_checkpointer):
    watcher = open_checkpointer()
    assert watcher.all_steps() == []
    writer = open_checkpointer(async_save=False)
    save_small(writer, 3)
    save_small(writer, 1)
    assert watcher.all_steps() == []  # as read when it opened
    assert watcher.all_steps(reload=True) == [1, 3]


def test_save_makes_the_checkpoints_folder_again_when_it_was_deleted(open_checkpointer, tmp_path):
    checkpointer = open_checkpointer()
    shutil.rmtree(tmp_path / "ckpt")
    save_small(checkpointer, 1)
    checkpointer.wait()
    assert checkpointer.all_steps() == [1] and open_checkpointer().metadata(1) == METADATA
