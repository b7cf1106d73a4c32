"""pmap and the sharded mesh give the parameters of one device on the same global batch; so
do the loss reductions a GPU runs."""

import contextlib
import functools
import os
import re
from typing import NamedTuple

import jax
import numpy as np
import pytest

from transformer_jax import losses, output_loss
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config
from transformer_jax.optim import make_optimizer
from transformer_jax.parallel import CPU_REGION_ANALYSIS, Parallel
from transformer_jax.steps import eval_step, train_step
from transformer_jax.train_state import create_train_state

# In one worker (make test's --dist loadgroup): the runs of the module's fixtures are made once.
pytestmark = pytest.mark.xdist_group("parallel")

# One layer: what is compared is how the devices split the step, not the stack.
CONFIG = get_model_config("tiny", vocab_size=50, dropout_rate=0.0, num_layers=1)
# conftest.py's 8 simulated CPU devices, also where a GPU is the default backend; the
# one-device runs use the first of them, so every comparison is CPU against CPU.
CPUS = jax.devices("cpu")
ROWS, LENGTH = 16, 7
# Adam's eps is 1e-3, not the paper's 1e-9: the key projections' biases get an exactly
# zero gradient (softmax ignores a shift shared by a row), and with eps=1e-9 Adam scales
# that gradient's rounding noise, different on each device layout, up to full steps.
OPTIMIZER = make_optimizer(d_model=CONFIG.d_model, warmup_steps=10, learning_rate_scale=5.0,
                           eps=1e-3)


def batches(n):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        targets = rng.integers(1, 50, (ROWS, LENGTH)).astype(np.int32)
        targets[:, -2:] *= rng.integers(0, 2, (ROWS, 1)).astype(np.int32)  # some padding
        out.append({"inputs": rng.integers(1, 50, (ROWS, LENGTH)).astype(np.int32),
                    "targets": targets})
    return out


def initial_state():
    model = Transformer(CONFIG)
    return model, create_train_state(model, OPTIMIZER.tx, jax.random.key(0))


def step_fn(model, accumulation_steps=1, loss_chunk_size=0):
    return functools.partial(
        train_step, model=model, seed=0, label_smoothing=0.1, accumulation_steps=accumulation_steps,
        learning_rate_fn=OPTIMIZER.learning_rate_fn, loss_chunk_size=loss_chunk_size)


def run_one_device(n_steps, accumulation_steps=1, loss_chunk_size=0):
    with jax.default_device(CPUS[0]):
        return _run_one_device(n_steps, accumulation_steps, loss_chunk_size)


def _run_one_device(n_steps, accumulation_steps, loss_chunk_size):
    model, state = initial_state()
    step = jax.jit(functools.partial(step_fn(model, accumulation_steps, loss_chunk_size),
                                     axis_name=None))
    losses = []
    for batch in batches(n_steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
    return state.params, losses


class ParallelRun(NamedTuple):
    """4 updates with one strategy: the parameters and losses after 3, and the number of
    compilations during each step (placing its batch and running it)."""

    params: dict
    losses: list[float]
    compiles: list[int]


def run_parallel(strategy, compiler_options=None, devices=CPUS, **step) -> ParallelRun:
    """`step`: `step_fn`'s accumulation_steps and loss_chunk_size."""
    model, state = initial_state()
    parallel = Parallel(strategy, devices)
    placed = parallel.put_state(state)
    step = parallel.compile_train_step(step_fn(model, **step), compiler_options)
    with counted_compiles() as compiled:
        losses, compiles, params = [], [], None
        for batch in batches(4):
            before = len(compiled)
            placed, metrics = step(placed, parallel.put_batch(batch))
            compiles.append(len(compiled) - before)
            host = parallel.to_host(metrics)
            losses.append(host["loss_sum"] / host["weight_sum"])
            if len(losses) == 3:  # a host copy: the next step donates the placed buffers
                params = parallel.get_state(placed).params
    return ParallelRun(params, losses[:3], compiles)


@contextlib.contextmanager
def counted_compiles():
    """A list that gets one entry for each XLA compilation while the block runs."""
    compiles = []

    def count(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(count)


@pytest.fixture(scope="module")
def one_device():
    return run_one_device(3)


@pytest.fixture(scope="module", params=["pmap", "sharded"])
def eight_devices(request) -> ParallelRun:
    """`run_parallel` of one strategy, run once for the tests of that strategy."""
    return run_parallel(request.param)


def test_eight_devices_match_one(one_device, eight_devices):
    """3 updates on 8 simulated devices (2 rows each) = 3 updates on one device (16 rows)."""
    assert len(CPUS) == 8
    params, losses = eight_devices.params, eight_devices.losses
    expected_params, expected_losses = one_device
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                 jax.device_get(params), jax.device_get(expected_params))
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), params,
                                         jax.device_get(initial_state()[1].params)))
    assert max(moved) > 1e-3  # the updates did something


def test_gradient_accumulation_matches_the_whole_batch(one_device):
    """4 micro-batches of 4 rows give the update of the whole 16-row batch."""
    params, losses = run_one_device(3, accumulation_steps=4)
    np.testing.assert_allclose(losses, one_device[1], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                 params, one_device[0])


def test_chunked_output_loss_trains_as_the_whole_logits(one_device):
    """loss_chunk_size=24 (16 × 7 = 112 target tokens: 5 chunks, the last padded) gives the
    losses and parameters of the whole (B, T, V) logits, 3 updates on."""
    params, losses = run_one_device(3, loss_chunk_size=24)
    np.testing.assert_allclose(losses, one_device[1], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                 params, one_device[0])


def test_eval_step_sums_match_across_strategies():
    """Eval sums (loss, tokens, correct) on 8 devices equal the one-device sums."""
    model, state = initial_state()
    batch = batches(1)[0]
    with jax.default_device(CPUS[0]):
        expected = jax.jit(functools.partial(eval_step, model=model))(state.params, batch)
        chunked = jax.jit(functools.partial(eval_step, model=model, loss_chunk_size=10))(
            state.params, batch)
    assert float(expected["weight_sum"]) == float((batch["targets"] > 0).sum())
    for key, value in expected.items():
        np.testing.assert_allclose(chunked[key], value, rtol=1e-5)
    for strategy in ("pmap", "sharded"):
        parallel = Parallel(strategy, CPUS)
        placed = parallel.put_state(state)
        got = parallel.to_host(parallel.compile_eval_step(functools.partial(
            eval_step, model=model))(placed.params, parallel.put_batch(batch)))
        for key, value in expected.items():
            np.testing.assert_allclose(got[key], float(value), rtol=1e-5)


def test_rows_must_split_over_devices():
    with pytest.raises(ValueError, match="do not split over 8"):
        Parallel("pmap", CPUS).put_batch({"inputs": np.zeros((12, 3), np.int32)})
    with pytest.raises(ValueError, match="parallelism must be one of"):
        Parallel("tpu-magic")


@pytest.mark.parametrize("devices", [1, 8])
def test_pmap_sums_over_its_devices_only_where_there_are_several(devices, one_device):
    """A sum over one device is the identity, and XLA's CPU backend compiled it as an
    all-reduce anyway: a copy of every gradient between the backward and Adam. So pmap's
    train and eval steps sum only over several devices, and on one train as one device."""
    model, state = initial_state()
    parallel = Parallel("pmap", CPUS[:devices])
    placed, batch = parallel.put_state(state), parallel.put_batch(batches(1)[0])
    programs = [(parallel.compile_train_step(step_fn(model)), placed),
                (parallel.compile_eval_step(functools.partial(eval_step, model=model)),
                 placed.params)]
    for step, first in programs:
        assert ("all-reduce" in step.lower(first, batch).compile().as_text()) == (devices > 1)
    if devices == 1:
        run = run_parallel("pmap", devices=CPUS[:1])
        np.testing.assert_allclose(run.losses, one_device[1], rtol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                     jax.device_get(run.params), jax.device_get(one_device[0]))


def test_the_sharded_cpu_step_copies_no_array_of_its_donated_state(one_device):
    """On CPUs the `sharded` step compiles with XLA's copy insertion by region
    (`parallel.CPU_REGION_ANALYSIS`): its program copies none of the state's arrays, of
    which XLA's default copies some (the option set back to off, as a caller's options
    may); and it trains as the one-device jit step does."""
    model, state = initial_state()
    parallel = Parallel("sharded", CPUS[:1])
    placed, batch = parallel.put_state(state), parallel.put_batch(batches(1)[0])
    lowered = parallel.compile_train_step(step_fn(model)).lower(placed, batch)
    off = {name: False for name in CPU_REGION_ANALYSIS}
    copied = [len(copied_parameters(lowered.compile(compiler_options=options).as_text()))
              for options in (None, off)]
    assert copied[0] == 0 and copied[1] > 0, copied
    run = run_parallel("sharded", devices=CPUS[:1])
    np.testing.assert_allclose(run.losses, one_device[1], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                 jax.device_get(run.params), jax.device_get(one_device[0]))


def test_the_sharded_step_runs_each_devices_share_of_every_micro_batch_and_chunk(one_device):
    """Under `sharded` (8 devices, 2 rows each) every micro-batch and every chunk of the
    output layer holds a share of each device's rows: the compiled step gathers no rows
    from other devices. (Contiguous micro-batches and chunks lay on some devices only: XLA
    gathered them, and every device ran each whole; with 4 devices of 8 rows, 2
    micro-batches then took 9.4 MB of temporary memory a device where one took 9.1, and
    now 5.2.) Both train as one device does."""
    model, state = initial_state()
    parallel = Parallel("sharded", CPUS)
    placed, batch = parallel.put_state(state), parallel.put_batch(batches(1)[0])

    def compiled(**step):
        return parallel.compile_train_step(step_fn(model, **step)).lower(placed, batch).compile()

    for program in (compiled(accumulation_steps=2), compiled(loss_chunk_size=8)):
        assert not re.search(r" all-gather(-start)?\(", program.as_text())
    run = run_parallel("sharded", accumulation_steps=2, loss_chunk_size=8)
    np.testing.assert_allclose(run.losses, one_device[1], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                 jax.device_get(run.params), jax.device_get(one_device[0]))


def copied_parameters(program: str) -> list[str]:
    """The names of a compiled program's entry parameters that it copies."""
    parameters = set(re.findall(r"(%[\w.\-]+) = \S+ parameter\(", program))
    return [name for name in re.findall(r"= \S+ copy\((%[\w.\-]+)\)", program)
            if name in parameters]


@pytest.mark.parametrize("strategy", ["pmap", "sharded"])
def test_the_state_is_placed_and_fetched_without_compiling(strategy):
    """`put_state` gives every device the whole state (pmap: one copy per device along a
    leading axis) and `get_state` gives it back on the host, bit for bit; neither compiles
    a program (flax's replicate compiled one per shape: 2.2 s of a tiny run's start)."""
    _, state = initial_state()
    host = jax.device_get(jax.device_put(state, CPUS[0]))  # the step as JAX holds it: int32
    parallel = Parallel(strategy, CPUS)
    with counted_compiles() as compiled:
        placed = parallel.put_state(state)
        fetched = parallel.get_state(placed)
    assert compiled == []
    for x, leaf in zip(jax.tree.leaves(placed), jax.tree.leaves(host)):
        assert {shard.device for shard in x.addressable_shards} == set(CPUS)
        for shard in x.addressable_shards:
            copy = np.asarray(shard.data)
            np.testing.assert_array_equal(copy[0] if strategy == "pmap" else copy, leaf)
    assert jax.tree.structure(fetched) == jax.tree.structure(host)
    for ours, leaf in zip(jax.tree.leaves(fetched), jax.tree.leaves(host)):
        assert isinstance(ours, np.ndarray) and ours.dtype == leaf.dtype
        np.testing.assert_array_equal(ours, leaf)


def test_no_recompilation_after_the_first_step(eight_devices):
    """Steps 2..4 reuse step 1's executable: the state's types do not drift between steps."""
    first, *later = eight_devices.compiles
    assert first >= 1
    assert later == [0, 0, 0]


@pytest.mark.parametrize("strategy", ["pmap", "sharded"])
def test_the_step_compiles_with_its_compiler_options(strategy, one_device, tmp_path):
    """XLA's options reach the step's program under either strategy (a profiled run's
    `profiling.TRACEABLE`: on a GPU, pmap's step ran in CUDA graphs without this), and the
    step is the same: the losses of one device, one compilation. Here the option is
    `xla_dump_to`, whose files show that the compiler had it."""
    run = run_parallel(strategy, compiler_options={"xla_dump_to": str(tmp_path)})
    np.testing.assert_allclose(run.losses, one_device[1], rtol=1e-5)
    assert run.compiles[0] >= 1 and run.compiles[1:] == [0, 0, 0]
    assert any(name.endswith("step.before_optimizations.txt") for name in os.listdir(tmp_path)), \
        os.listdir(tmp_path)


@pytest.mark.parametrize("strategy", ["pmap", "sharded"])
@pytest.mark.parametrize("devices", [1, 8])
def test_local_params_are_placed_as_restored_parameters_are(strategy, devices):
    """The copy training's BLEU searches use: single-device arrays on the first device, as a
    checkpoint restores them, so a search of either compiles to one program (which
    WORKDIR/compilation_cache then keeps once, for training and evaluate.py alike). On one
    device, pmap's unreplicated arrays were on a mesh of that device: another program."""
    _, state = initial_state()
    parallel = Parallel(strategy, CPUS[:devices])
    local = parallel.local_params(parallel.put_state(state))
    restored = jax.device_put(jax.device_get(state.params), CPUS[0])
    for ours, theirs in zip(jax.tree.leaves(local), jax.tree.leaves(restored)):
        assert ours.sharding == theirs.sharding and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)
    total = jax.jit(lambda params: sum(x.sum() for x in jax.tree.leaves(params)))
    assert total.lower(local).as_text() == total.lower(restored).as_text()


@pytest.fixture(scope="module")
def xla_one_device():
    """`one_device` with XLA's reductions over V, which the CPU runs, on any machine."""
    with pytest.MonkeyPatch.context() as patch:
        use_logit_terms(patch, losses.xla_logit_terms)
        return run_one_device(3)


@pytest.fixture
def gpu_reductions(monkeypatch):
    """The loss's reductions over V as a GPU takes them (`losses.two_pass_logit_terms`, a
    custom VJP) in place of XLA's, on these CPUs; the list gets the shape of each call's
    logits."""
    calls = []

    def two_pass(logits, targets):
        calls.append(logits.shape)
        return losses.two_pass_logit_terms(logits, targets)

    use_logit_terms(monkeypatch, two_pass)
    return calls


def use_logit_terms(patch: pytest.MonkeyPatch, logit_terms):
    """`logit_terms` in place of `losses.logit_terms`, for the whole logits and the chunks."""
    patch.setattr(losses, "logit_terms", logit_terms)
    patch.setattr(output_loss, "logit_terms", logit_terms)


@pytest.mark.parametrize("strategy", ["pmap", "sharded"])
def test_the_gpus_loss_reductions_train_as_xlas(xla_one_device, gpu_reductions, strategy):
    """A GPU's step runs the two passes (train.py's default `pmap`, the suite's `sharded`):
    on 8 devices, and through accumulation's scan on one, they give the losses and
    parameters of XLA's reductions on one device, 3 updates on."""
    runs = {strategy: run_parallel(strategy)[:2],
            "accumulated": run_one_device(3, accumulation_steps=4)}
    rows = {"pmap": ROWS // len(CPUS), "sharded": ROWS}[strategy]  # a device's, a global's
    assert set(gpu_reductions) == {(rows, LENGTH, CONFIG.vocab_size),
                                   (ROWS // 4, LENGTH, CONFIG.vocab_size)}  # and a micro-batch
    expected_params, expected_losses = xla_one_device
    for name, (params, step_losses) in runs.items():
        np.testing.assert_allclose(step_losses, expected_losses, rtol=1e-5, err_msg=name)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                     jax.device_get(params), jax.device_get(expected_params))
