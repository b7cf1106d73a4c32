"""train_step and eval_step: their dropout draws (per step, micro-batch and pmap device), the
sums they return over every device, the logged gradient norm, and evaluation's plain loss.

test_parallel.py compares whole runs without dropout; these look at one step's values."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.losses import label_smoothed_cross_entropy
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config
from transformer_jax.optim import make_optimizer
from transformer_jax.parallel import Parallel
from transformer_jax.steps import eval_step, train_step
from transformer_jax.train_state import create_train_state

CPUS = jax.devices("cpu")
OPTIMIZER = make_optimizer(d_model=32, warmup_steps=10)


def model(dropout_rate=0.1):
    return Transformer(get_model_config("tiny", vocab_size=50, num_layers=1,
                                        dropout_rate=dropout_rate))


def rows(n, seed=0):
    """`n` rows of 7 token ids, the last two of some rows padding."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(1, 50, (n, 7)).astype(np.int32)
    targets[:, -2:] *= rng.integers(0, 2, (n, 1)).astype(np.int32)
    return {"inputs": rng.integers(1, 50, (n, 7)).astype(np.int32), "targets": targets}


def state(of_model, step=0):
    with jax.default_device(CPUS[0]):
        return create_train_state(of_model, OPTIMIZER.tx, jax.random.key(0)).replace(
            step=jnp.asarray(step, jnp.int32))


def metrics(batch, *, of_model=None, step=0, accumulation_steps=1, strategy="sharded",
            devices=1):
    """The host metrics of one train_step of `of_model` on `batch` (the state at `step`)."""
    of_model = of_model or model()
    parallel = Parallel(strategy, CPUS[:devices])
    step_fn = parallel.compile_train_step(functools.partial(
        train_step, model=of_model, seed=0, label_smoothing=0.1,
        learning_rate_fn=OPTIMIZER.learning_rate_fn, accumulation_steps=accumulation_steps))
    placed = parallel.put_state(state(of_model, step))
    return parallel.to_host(step_fn(placed, parallel.put_batch(batch))[1])


def test_dropout_is_drawn_again_at_each_step_and_only_in_training():
    """The loss is taken before the update, so at steps 0 and 1 of the same parameters and
    rows only dropout can tell them apart: they differ, and each equals itself (a resume
    draws what the run drew); without dropout the loss is another."""
    batch = rows(4)
    at_0, at_1 = metrics(batch), metrics(batch, step=1)
    assert at_0["loss_sum"] != pytest.approx(at_1["loss_sum"], rel=1e-4)
    assert metrics(batch)["loss_sum"] == at_0["loss_sum"]
    assert metrics(batch, of_model=model(0.0))["loss_sum"] != pytest.approx(
        at_0["loss_sum"], rel=1e-4)


def test_each_micro_batch_draws_its_own_dropout():
    """Micro-batch k holds every k-th row: rows x, x interleaved in 2 micro-batches are x
    twice. The first draws as x alone does; the second draws other masks, so the sum is
    not twice x's (it was, when every micro-batch took the same key)."""
    x = rows(4)
    twice = {key: np.repeat(value, 2, axis=0) for key, value in x.items()}
    alone, both = metrics(x), metrics(twice, accumulation_steps=2)
    assert both["weight_sum"] == 2 * alone["weight_sum"]
    assert both["loss_sum"] != pytest.approx(2 * alone["loss_sum"], rel=1e-4)


def test_each_pmap_device_draws_its_own_dropout():
    """pmap on 2 devices of rows x, x: device 0 draws as one device with x does, device 1
    folds its index into the key and draws other masks (the same masks on every device
    would give twice x's loss)."""
    x = rows(4)
    twice = {key: np.concatenate([value, value]) for key, value in x.items()}
    alone = metrics(x, strategy="pmap")
    both = metrics(twice, strategy="pmap", devices=2)
    assert both["weight_sum"] == 2 * alone["weight_sum"]
    assert both["loss_sum"] != pytest.approx(2 * alone["loss_sum"], rel=1e-4)


@pytest.mark.parametrize("strategy", ["pmap", "sharded"])
def test_the_metrics_are_sums_over_every_device(strategy):
    """On 8 devices the step returns the sums of the global batch: its target tokens
    counted in NumPy, and the loss sum of one device's step on the same rows (without
    dropout, which draws per device under pmap)."""
    batch, of_model = rows(16), model(0.0)
    one = metrics(batch, of_model=of_model)
    eight = metrics(batch, of_model=of_model, strategy=strategy, devices=8)
    assert eight["weight_sum"] == one["weight_sum"] == np.count_nonzero(batch["targets"])
    assert eight["loss_sum"] == pytest.approx(one["loss_sum"], rel=1e-5)
    assert eight["correct_sum"] == one["correct_sum"]


def test_the_logged_grad_norm_is_of_the_mean_losss_gradient():
    """grad_norm is the L2 norm of the gradient of the mean smoothed loss per target token
    (the gradient Adam gets), summed in float64 over every parameter."""
    batch, of_model = rows(4), model(0.0)
    params = state(of_model).params

    def mean_loss(params):
        logits = of_model.apply({"params": params}, batch["inputs"], batch["targets"])
        loss_sum, weight_sum = label_smoothed_cross_entropy(logits, batch["targets"],
                                                            label_smoothing=0.1)
        return loss_sum / weight_sum

    grads = jax.grad(mean_loss)(params)
    expected = np.sqrt(sum(np.sum(np.float64(g) ** 2) for g in jax.tree.leaves(grads)))
    assert metrics(batch, of_model=of_model)["grad_norm"] == pytest.approx(expected, rel=1e-5)


def test_evaluation_sums_the_plain_cross_entropy():
    """eval_step's loss_sum is −Σ log softmax(logits)[target] over the real target tokens
    (no label smoothing), from the model's logits in float64 NumPy."""
    batch, of_model = rows(4), model()
    params = state(of_model).params
    logits = np.float64(of_model.apply({"params": params}, batch["inputs"], batch["targets"]))
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    targets = batch["targets"]
    picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    expected = -(picked * (targets != 0)).sum()
    sums = jax.jit(functools.partial(eval_step, model=of_model))(params, batch)
    assert float(sums["loss_sum"]) == pytest.approx(expected, rel=1e-5)
    assert float(sums["weight_sum"]) == np.count_nonzero(targets)
