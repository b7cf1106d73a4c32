"""Dropout from fewer random bits (dropout.py): its rate, its scale, independent decisions,
any shape, bfloat16, and clear errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.dropout import dropout
from transformer_jax.layers import Dropout
from transformer_jax.model_config import ModelConfig

N_ELEMENTS = 1 << 22  # 0.1016 (8 bits) is 10 σ from 0.1


def dropped(bits: int, rate: float, shape=(1024, N_ELEMENTS // 1024), seed=0) -> np.ndarray:
    return np.asarray(dropout(jnp.ones(shape, jnp.float32), rate, jax.random.key(seed),
                              bits=bits))


@pytest.mark.parametrize("bits,rate,zeroed", [
    (8, 0.1, 26 / 256),  # round(25.6) = 26: 0.1016
    (16, 0.1, 6554 / 65536),
    (32, 0.3, round(0.3 * 2**32) / 2**32),
    (8, 0.5, 0.5),
])
def test_zeroes_the_rounded_rate_and_scales_the_rest_to_keep_the_mean(bits, rate, zeroed):
    y = dropped(bits, rate)
    fraction = np.mean(y == 0)
    sigma = math.sqrt(zeroed * (1 - zeroed) / y.size)
    assert abs(fraction - zeroed) < 4 * sigma, (fraction, zeroed)
    kept = y[y != 0]
    np.testing.assert_allclose(kept, 1 / (1 - zeroed), rtol=1e-6)
    # E[y] = 1: the scale is of the rate drawn, not the rate asked for.
    assert abs(y.mean() - 1) < 4 * sigma / (1 - zeroed)


@pytest.mark.parametrize("bits", [8, 16])
def test_decisions_taken_from_one_draw_are_independent(bits):
    """Neighbours along the last axis share a 32-bit draw: both are zeroed with probability
    p², not p (a decision copied across the draw's parts would give p)."""
    y = dropped(bits, 0.5) == 0
    both = np.mean(y[:, 0::2] & y[:, 1::2])
    sigma = math.sqrt(0.25 * 0.75 / (y.size // 2))
    assert abs(both - 0.25) < 4 * sigma, both


def test_a_key_gives_one_mask_and_another_key_another():
    a, again = dropped(16, 0.1, (4, 6), 0), dropped(16, 0.1, (4, 6), 0)
    other = dropped(16, 0.1, (64, 64), 1) != dropped(16, 0.1, (64, 64), 0)
    np.testing.assert_array_equal(a, again)
    assert other.any()


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 6), (0, 5), (3, 0)])
def test_any_shape_including_a_last_axis_the_packing_does_not_divide(shape):
    x = jnp.arange(1, math.prod(shape) + 1, dtype=jnp.float32).reshape(shape)
    y = np.asarray(dropout(x, 0.5, jax.random.key(3), bits=8))
    assert y.shape == shape
    assert np.all((y == 0) | np.isclose(y, np.asarray(x) * 2))


def test_bfloat16_is_scaled_in_float32_and_rounded_once():
    """Each kept bfloat16 value is bfloat16(x · 65536 / 58982) of float32 x: a bfloat16
    scale (1.109375 for 1.1111) would shrink every kept value by 0.16 %."""
    x = jax.random.normal(jax.random.key(1), (64, 64), jnp.float32).astype(jnp.bfloat16)
    y = np.asarray(dropout(x, 0.1, jax.random.key(0)), np.float32)
    expected = np.asarray((x.astype(jnp.float32) * np.float32(65536 / 58982)).astype(jnp.bfloat16),
                          np.float32)
    kept = y != 0
    assert 0.85 < kept.mean() < 0.95
    np.testing.assert_array_equal(y[kept], expected[kept])
    assert dropout(x, 0.1, jax.random.key(0)).dtype == jnp.bfloat16


def test_rate_zero_is_the_identity_and_the_module_is_off_when_deterministic():
    x = jnp.arange(1.0, 7.0)
    assert dropout(x, 0.0, None) is x
    module = Dropout(0.5, bits=8)
    np.testing.assert_array_equal(module.apply({}, x, deterministic=True), x)
    y = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
    assert np.any(np.asarray(y) == 0)
    assert np.all((np.asarray(y) == 0) | (np.asarray(y) == 2 * np.asarray(x)))


@pytest.mark.parametrize("bits, kept", [(8, 256 / 230), (16, 65536 / 58982)])
def test_the_module_draws_with_its_bits(bits, kept):
    """layers.Dropout(0.1, bits) zeroes round(0.1 · 2^bits) / 2^bits and scales the rest by
    its inverse: 256 / 230 with 8 bits, 65536 / 58982 with 16 (the config's dropout_bits)."""
    y = np.asarray(Dropout(0.1, bits=bits).apply({}, jnp.ones((32, 32)), deterministic=False,
                                                  rngs={"dropout": jax.random.key(0)}))
    assert 0 < np.mean(y == 0) < 0.2
    np.testing.assert_allclose(y[y != 0], np.float32(kept), rtol=1e-7)


@pytest.mark.parametrize("kwargs,message", [
    (dict(rate=0.1, bits=12), "bits must be one of"),
    (dict(rate=1.0, bits=16), r"in \[0, 1\)"),
    (dict(rate=0.001, bits=8), "rate 0.001 rounds to 0 in 8 random bits"),
    (dict(rate=0.999, bits=8), "rate 0.999 rounds to 1 in 8 random bits"),
])
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dropout(jnp.ones(3), key=jax.random.key(0), **kwargs)


@pytest.mark.parametrize("fields,message", [
    (dict(dropout_bits=4), "dropout_bits must be one of 8, 16, 32"),
    (dict(dropout_rate=0.001, dropout_bits=8), "dropout_rate 0.001 rounds to 0 in 8 random"),
    (dict(dropout_rate=0.999, dropout_bits=8), "dropout_rate 0.999 rounds to 1 in 8 random"),
    (dict(attention_dropout_rate=1e-6), "attention_dropout_rate 1e-06 rounds to 0 in 16"),
])
def test_model_config_refuses_bits_that_cannot_draw_its_rates(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


def test_a_missing_key_is_one_clear_error_unless_nothing_is_dropped():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="needs a PRNG key"):
        dropout(x, 0.1, None)
    assert dropout(x, 0.0, None) is x


def test_a_seed_for_a_key_and_integer_inputs_are_refused_in_one_line():
    """An int seed in place of a key would fail deep inside jax.random; integer x would
    round the kept values' 1 / (1 - rate) away (1 stays 1). Typed and raw keys both work."""
    x = jnp.ones((2, 3))
    with pytest.raises(TypeError) as error:
        dropout(x, 0.1, 0)
    assert str(error.value) == ("dropout's key must be a JAX PRNG key, e.g. "
                                "jax.random.key(0), got 0")
    with pytest.raises(TypeError) as error:
        dropout(jnp.ones((2, 3), jnp.int32), 0.1, jax.random.key(0))
    assert str(error.value) == ("dropout scales x by 1 / (1 - rate): x must be floating "
                                "point, got int32")
    with pytest.raises(TypeError, match=r"^dropout's x must be an array, got a list "
                                        r"\(jnp.asarray makes one\)$"):
        dropout([1.0, 2.0], 0.5, jax.random.key(0))
    # Two keys where one belongs, typed or raw: a one-line error naming vmap, which takes them.
    for keys in (jax.random.split(jax.random.key(0)), jax.random.split(jax.random.PRNGKey(0))):
        with pytest.raises(ValueError, match=r"^dropout takes one PRNG key, got keys of shape "
                                             r"\(2,( 2)?\); jax.vmap dropout over them"):
            dropout(x, 0.1, keys)
    per_key = jax.vmap(dropout, in_axes=(None, None, 0))(x, 0.5, jax.random.split(
        jax.random.key(3)))
    np.testing.assert_array_equal(per_key[1], dropout(x, 0.5, jax.random.split(
        jax.random.key(3))[1]))
    # The key and the rate swapped, and a rate traced under jax.jit: no threshold to draw.
    with pytest.raises(ValueError, match=r"^dropout rate must be a number in \[0, 1\), got "):
        dropout(x, jax.random.key(0), 0.1)
    with pytest.raises(ValueError, match=r"under jax.jit, a static argument\), got \w*Tracer"):
        jax.jit(dropout)(x, 0.1, jax.random.key(0))
    jitted = jax.jit(dropout, static_argnames="rate")(x, rate=0.5, key=jax.random.key(3))
    typed, raw = dropout(x, 0.5, jax.random.key(3)), dropout(x, 0.5, jax.random.PRNGKey(3))
    np.testing.assert_array_equal(jitted, typed)
    for scalar in (np.float64(0.5), jnp.float32(0.5), np.array(0.5)):  # a number, as before
        np.testing.assert_array_equal(dropout(x, scalar, jax.random.key(3)), typed)
    np.testing.assert_array_equal(typed, raw)
    assert set(np.unique(np.asarray(typed)).tolist()) <= {0.0, 2.0}
