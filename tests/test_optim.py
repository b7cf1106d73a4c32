"""The learning-rate schedule (§5.3, eq. 3) and Adam against hand numbers and NumPy Adam."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpy.testing import assert_allclose

from transformer_jax.optim import (learning_rate, learning_rate_schedule, make_optimizer,
                                   optimizer_from_config)

BASE = dict(d_model=512, warmup_steps=4000)

# These tests call optax directly (the train step does so under standard promotion).
pytestmark = pytest.mark.usefixtures("standard_dtype_promotion")


# --- learning_rate ------------------------------------------------------------


def test_base_values_by_hand():
    """Steps 1, 4000 (the peak, about 7.0e-4) and 100000 for base."""
    assert_allclose(learning_rate(1, **BASE), 512**-0.5 * 1 * 4000**-1.5, rtol=1e-12)
    assert_allclose(learning_rate(4000, **BASE), 512**-0.5 * 4000**-0.5, rtol=1e-12)
    assert_allclose(learning_rate(100_000, **BASE), 512**-0.5 * 100_000**-0.5, rtol=1e-12)
    assert_allclose(learning_rate(1, **BASE), 1.7469e-7, rtol=1e-4)
    assert_allclose(learning_rate(4000, **BASE), 6.988e-4, rtol=1e-4)
    assert abs(learning_rate(4000, **BASE) - 7.0e-4) < 0.05e-4  # the documented "about 7.0e-4"


def test_peak_is_at_warmup():
    """The rate at warmup_steps is above its neighbours and every sampled step."""
    for warmup in (1, 7, 4000):
        peak = learning_rate(warmup, d_model=512, warmup_steps=warmup)
        assert learning_rate(warmup + 1, d_model=512, warmup_steps=warmup) < peak
        if warmup > 1:
            assert learning_rate(warmup - 1, d_model=512, warmup_steps=warmup) < peak
    rates = np.asarray(learning_rate(jnp.arange(1, 20_001), **BASE))
    assert int(np.argmax(rates)) + 1 == 4000


@pytest.mark.parametrize("k", [1, 7, 100, 1999])
def test_linear_during_warmup(k):
    """lr(2k) = 2 lr(k) while 2k <= warmup."""
    assert_allclose(learning_rate(2 * k, **BASE), 2 * learning_rate(k, **BASE), rtol=1e-12)


@pytest.mark.parametrize("k", [4000, 5000, 25_000])
def test_inverse_sqrt_after_warmup(k):
    """lr(4k) = lr(k) / 2 once k >= warmup."""
    assert_allclose(learning_rate(4 * k, **BASE), learning_rate(k, **BASE) / 2, rtol=1e-12)


def test_scale_multiplies():
    """scale multiplies the rate at every step."""
    for step in (1, 4000, 100_000):
        assert_allclose(learning_rate(step, **BASE, scale=2.5),
                        2.5 * learning_rate(step, **BASE), rtol=1e-12)


def test_arrays_give_float32_equal_to_python():
    """An array of steps, eager or jitted, gives float32 equal to the Python-int values."""
    steps = [1, 2, 999, 3999, 4000, 4001, 100_000, 300_000]
    expected = [learning_rate(s, **BASE) for s in steps]
    eager = learning_rate(jnp.array(steps), **BASE)
    jitted = jax.jit(lambda s: learning_rate(s, **BASE))(jnp.array(steps))
    assert eager.dtype == jnp.float32 and jitted.dtype == jnp.float32
    assert_allclose(np.asarray(eager), expected, rtol=1e-6)
    assert_allclose(np.asarray(jitted), expected, rtol=1e-6)


def test_step_zero():
    """An integer step 0 raises (steps are 1-based), NumPy's as Python's; an array step of 0
    or less gives 0, not inf or NaN (rsqrt of a negative); NumPy's integers give floats."""
    for zero in (0, np.int64(0)):
        with pytest.raises(ValueError, match="^step is 1-based, got 0$"):
            learning_rate(zero, **BASE)
    assert np.asarray(learning_rate(jnp.array([-3, -1, 0]), **BASE)).tolist() == [0.0] * 3
    assert learning_rate(np.int32(4000), **BASE) == learning_rate(4000, **BASE)
    assert isinstance(learning_rate(np.int32(4000), **BASE), float)


# --- learning_rate_schedule ---------------------------------------------------


def test_schedule_count_c_is_step_c_plus_one():
    """optax's count 0 (the first update) uses step 1; count 3999 the peak."""
    schedule = learning_rate_schedule(**BASE, scale=2.0)
    for count in (0, 1, 3999, 99_999):
        expected = learning_rate(count + 1, **BASE, scale=2.0)
        assert_allclose(float(schedule(jnp.array(count, jnp.int32))), expected, rtol=1e-6)
    assert float(schedule(0)) > 0.0


# --- make_optimizer -----------------------------------------------------------


def numpy_adam(grads, *, lrs, b1=0.9, b2=0.98, eps=1e-9):
    """Adam (Kingma & Ba, with bias correction) in float64; returns the update of each step."""
    m = v = np.zeros_like(grads[0], np.float64)
    updates = []
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        g = np.asarray(g, np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        updates.append(-lr * m_hat / (np.sqrt(v_hat) + eps))
    return updates


def run_optax(opt, grads):
    """The update of each step for the given gradient sequence, from zero parameters."""
    params = jnp.zeros_like(grads[0])
    state = opt.init(params)
    updates = []
    for g in grads:
        update, state = opt.update(jnp.asarray(g), state, params)
        params = optax.apply_updates(params, update)
        updates.append(np.asarray(update))
    return updates


def test_adam_matches_numpy_on_a_quadratic():
    """Three steps on f(x) = ½ Σ a x² match NumPy Adam with the paper's β, ε and schedule."""
    a = np.array([1.0, 3.0, 0.5], np.float32)
    cfg = dict(d_model=16, warmup_steps=2)
    opt = make_optimizer(**cfg).tx
    x = jnp.array([1.0, -2.0, 4.0])
    state = opt.init(x)
    grads, updates = [], []
    for _ in range(3):
        g = np.asarray(a * x)
        update, state = opt.update(jnp.asarray(g), state, x)
        x = optax.apply_updates(x, update)
        grads.append(g)
        updates.append(np.asarray(update))
    lrs = [learning_rate(t, **cfg) for t in (1, 2, 3)]
    expected = numpy_adam(grads, lrs=lrs)
    for got, want in zip(updates, expected):
        assert_allclose(got, want, rtol=1e-5)
    # First step: m̂ = g, v̂ = g², so the update is -lr · g / (|g| + ε).
    assert_allclose(updates[0], -lrs[0] * grads[0] / (np.abs(grads[0]) + 1e-9), rtol=1e-6)


def test_clipping_scales_the_gradient_to_the_norm():
    """With grad_clip_norm=1, a gradient of norm 10 acts as that gradient scaled to norm 1.

    Adam's first step ignores the gradient's scale, so the clipped gradient comes second.
    """
    small, big = np.array([0.3, -0.4], np.float32), np.array([6.0, 8.0], np.float32)
    cfg = dict(d_model=16, warmup_steps=2)
    clipped = run_optax(make_optimizer(**cfg, grad_clip_norm=1.0).tx, [small, big])
    by_hand = run_optax(make_optimizer(**cfg).tx, [small, big / 10])
    unclipped = run_optax(make_optimizer(**cfg).tx, [small, big])
    assert_allclose(clipped[1], by_hand[1], rtol=1e-6)
    assert np.abs(unclipped[1] - clipped[1]).max() > 1e-4 * np.abs(clipped[1]).max()
    lrs = [learning_rate(t, **cfg) for t in (1, 2)]
    assert_allclose(clipped[1], numpy_adam([small, big / 10], lrs=lrs)[1], rtol=1e-5)


def test_paper_defaults():
    """The defaults are the paper's β1 0.9, β2 0.98, ε 1e-9: equal to an explicit optax.adam."""
    g = [np.array([0.2, -1.0], np.float32), np.array([0.5, 0.1], np.float32)]
    explicit = optax.adam(learning_rate_schedule(**BASE), b1=0.9, b2=0.98, eps=1e-9)
    for got, want in zip(run_optax(make_optimizer(**BASE).tx, g), run_optax(explicit, g)):
        np.testing.assert_array_equal(got, want)


def test_optimizer_from_config_passes_every_setting():
    """A run config's optim group reaches Adam whole: β1, β2, ε, the schedule's warmup and
    scale, and the clipping norm, each unlike its default, against NumPy Adam on the
    gradients clipped by hand (the second has norm 10, clipped to 0.5)."""
    group = dict(warmup_steps=3, learning_rate_scale=2.0, b1=0.5, b2=0.75, eps=0.1,
                 grad_clip_norm=0.5)
    grads = [np.array([0.3, -0.1], np.float32), np.array([6.0, 8.0], np.float32)]
    got = run_optax(optimizer_from_config(group, d_model=16).tx, grads)
    clipped = [grads[0], grads[1] * np.float32(0.05)]
    lrs = [learning_rate(t, d_model=16, warmup_steps=3, scale=2.0) for t in (1, 2)]
    expected = numpy_adam(clipped, lrs=lrs, b1=0.5, b2=0.75, eps=0.1)
    for update, want in zip(got, expected):
        assert_allclose(update, want, rtol=1e-5)


def test_the_logged_rate_is_the_rate_of_the_update():
    """The schedule make_optimizer returns gives, at count c, the rate that moved the
    parameters in update c + 1, which is eq. 3's rate at step c + 1."""
    optimizer = make_optimizer(d_model=16, warmup_steps=3, learning_rate_scale=2.0)
    x, state = jnp.array([1.0]), optimizer.tx.init(jnp.array([1.0]))
    for count in range(4):
        update, state = optimizer.tx.update(jnp.array([0.5]), state, x)
        # With a constant gradient g, Adam's bias-corrected moments are g and g², so every
        # update is -lr · g / (|g| + ε) = -lr here (g = 0.5, ε = 1e-9).
        assert_allclose(float(update[0]), -float(optimizer.learning_rate_fn(count)), rtol=1e-6)
        assert_allclose(float(optimizer.learning_rate_fn(count)),
                        learning_rate(count + 1, d_model=16, warmup_steps=3, scale=2.0),
                        rtol=1e-6)


@pytest.mark.parametrize("step", [True, "10", None, np.True_, jnp.bool_(True), b"10",
                                  np.array([True, False])])
def test_a_step_that_is_no_number_raises(step):
    """Bools and text were taken as steps (True as step 1, "10" as step 10)."""
    with pytest.raises(ValueError) as error:
        learning_rate(step, d_model=512)
    assert str(error.value) == f"step must be a number or an array of them, got {step!r}"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(d_model=0), "d_model"),
        (dict(d_model=512.5), "d_model"),  # gave a rate
        (dict(d_model="512"), "d_model"),  # a TypeError from `<`
        (dict(d_model=512, warmup_steps=0), "warmup_steps"),
        (dict(d_model=512, warmup_steps=4000.5), "warmup_steps"),
        (dict(d_model=512, scale=0.0), "scale"),
        (dict(d_model=512, scale=-1.0), "scale"),
        (dict(d_model=512, scale=float("inf")), "scale"),
    ],
)
def test_bad_schedule_arguments_raise(kwargs, name):
    """learning_rate and learning_rate_schedule name the bad argument."""
    with pytest.raises(ValueError, match=name):
        learning_rate(1, **kwargs)
    with pytest.raises(ValueError, match=name):
        learning_rate_schedule(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(d_model=0), "d_model"),
        (dict(d_model=512, warmup_steps=0), "warmup_steps"),
        (dict(d_model=512, learning_rate_scale=0.0), "learning_rate_scale"),
        (dict(d_model=512, grad_clip_norm=-1.0), "grad_clip_norm"),
    ],
)
def test_bad_optimizer_arguments_raise(kwargs, name):
    """make_optimizer names the bad argument, grad_clip_norm included."""
    with pytest.raises(ValueError, match=name):
        make_optimizer(**kwargs)

