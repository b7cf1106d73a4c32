"""Sinusoidal positional encoding (§3.5) against the paper's formula."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from transformer_jax.positional import sinusoidal_encoding


def paper_pe(positions, d_model):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), float64 loops."""
    positions = np.asarray(positions, dtype=np.float64)
    out = np.zeros(positions.shape + (d_model,), dtype=np.float64)
    for idx in np.ndindex(positions.shape):
        pos = positions[idx]
        for dim in range(d_model):
            two_i = dim - dim % 2
            angle = pos / 10000.0 ** (two_i / d_model)
            out[idx + (dim,)] = math.sin(angle) if dim % 2 == 0 else math.cos(angle)
    return out


def test_matches_formula_for_sequence_positions():
    """Positions of shape (T,) give the paper's values, shape (T, D)."""
    pos_T = np.arange(13)
    pe_TD = sinusoidal_encoding(pos_T, 16)
    assert pe_TD.shape == (13, 16)
    assert_allclose(np.asarray(pe_TD), paper_pe(pos_T, 16), rtol=1e-5, atol=1e-5)


def test_matches_formula_for_packed_batch_positions():
    """Arbitrary (B, T) positions, e.g. packed rows restarting at 0, give (B, T, D)."""
    pos_BT = np.array([[0, 1, 2, 0, 1, 0, 3], [5, 9, 0, 1, 2, 3, 42]])
    pe_BTD = sinusoidal_encoding(pos_BT, 10)
    assert pe_BTD.shape == (2, 7, 10)
    assert_allclose(np.asarray(pe_BTD), paper_pe(pos_BT, 10), rtol=1e-5, atol=1e-5)


def test_positions_past_256_keep_their_exact_value():
    """Positions of long sequences (257 and 1001: no bfloat16 holds them) give the formula's
    values, each position its own."""
    pos_T = np.array([255, 257, 1001, 4097])
    assert_allclose(np.asarray(sinusoidal_encoding(pos_T, 8)), paper_pe(pos_T, 8), atol=1e-3)


def test_scalar_position_gives_vector():
    """A scalar position (one decoding step) gives shape (d_model,)."""
    pe_D = sinusoidal_encoding(jnp.asarray(5), 6)
    assert pe_D.shape == (6,)
    assert_allclose(np.asarray(pe_D), paper_pe(5, 6), rtol=1e-5, atol=1e-6)


def test_odd_d_model():
    """An odd d_model ends with an unpaired sine dimension and still matches the formula."""
    pos_T = np.array([0, 3, 11, 17])
    pe_TD = sinusoidal_encoding(pos_T, 7)
    assert pe_TD.shape == (4, 7)
    assert_allclose(np.asarray(pe_TD), paper_pe(pos_T, 7), rtol=1e-5, atol=1e-5)


def test_hand_computed_values():
    """PE(0) = [0,1,0,1,...], PE(1)[0] = sin 1, PE(1)[1] = cos 1, d=4: PE(2)[2] = sin(2/100)."""
    assert_allclose(np.asarray(sinusoidal_encoding(0, 6)), [0, 1, 0, 1, 0, 1], atol=1e-7)
    pe_D = np.asarray(sinusoidal_encoding(1, 8))
    assert_allclose(pe_D[0], math.sin(1.0), rtol=1e-6)
    assert_allclose(pe_D[1], math.cos(1.0), rtol=1e-6)
    # d=4, dim 2 is 2i=2: timescale 10000^(2/4) = 100.
    assert_allclose(np.asarray(sinusoidal_encoding(2, 4))[2], math.sin(0.02), rtol=1e-6)
    assert_allclose(np.asarray(sinusoidal_encoding(2, 4))[3], math.cos(0.02), rtol=1e-6)


def test_max_timescale_replaces_the_10000():
    """max_timescale is the base of §3.5's 10000^(2i/d): with 100 and d = 4, dims 2 and 3 of
    PE(3) are sin and cos of 3 / 100^(2/4) = 0.3; dims 0 and 1 (2i = 0) do not depend on it."""
    pe_D = np.asarray(sinusoidal_encoding(3, 4, max_timescale=100.0))
    assert_allclose(pe_D, [math.sin(3.0), math.cos(3.0), math.sin(0.3), math.cos(0.3)],
                    rtol=1e-6)


def test_dtype_and_shape():
    """Output is float32 with shape (..., d_model), also for integer positions."""
    pe_BTD = sinusoidal_encoding(jnp.zeros((3, 5), dtype=jnp.int32), 4)
    assert pe_BTD.dtype == jnp.float32
    assert pe_BTD.shape == (3, 5, 4)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_relative_offset_is_a_linear_rotation(k):
    """§3.5: PE(pos + k) = M_k PE(pos), M_k block diagonal with 2x2 rotations by k*w_i."""
    d_model = 12
    w_I = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    m_DD = np.zeros((d_model, d_model))
    for i, w in enumerate(w_I):
        c, s = math.cos(k * w), math.sin(k * w)
        # [sin(a+b); cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a; cos a]
        m_DD[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    pos_P = np.arange(0, 90)
    pe_PD = np.asarray(sinusoidal_encoding(pos_P, d_model), dtype=np.float64)
    shifted_PD = np.asarray(sinusoidal_encoding(pos_P + k, d_model), dtype=np.float64)
    assert_allclose(pe_PD @ m_DD.T, shifted_PD, atol=1e-4)


@pytest.mark.parametrize("d_model", [0, -3, 16.0, True])
def test_a_d_model_that_is_no_positive_integer_raises(d_model):
    """d_model < 1, or not an integer (16.0 failed in jnp.arange's shape), raises ValueError."""
    with pytest.raises(ValueError, match=f"^d_model must be a positive integer, got {d_model}$"):
        sinusoidal_encoding(np.arange(3), d_model)


@pytest.mark.parametrize("max_timescale", [0.0, -1.0, float("nan"), float("inf"), "1e4"])
def test_a_timescale_that_is_not_positive_raises(max_timescale):
    """The 10000 of §3.5 must be > 0: 0 or less gave columns of NaN."""
    with pytest.raises(ValueError, match="^max_timescale must be a finite number > 0, got "):
        sinusoidal_encoding(np.arange(3), 8, max_timescale=max_timescale)
