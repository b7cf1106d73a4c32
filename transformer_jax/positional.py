"""Sinusoidal positional encoding (§3.5). Pure jax.numpy, no Flax."""

import jax.numpy as jnp

from transformer_jax.argument_checks import finite_number, positive_int


def sinusoidal_encoding(positions, d_model: int, *, max_timescale: float = 10_000.0):
    """The paper's positional encoding, interleaved as in §3.5.

        PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    Sine on even dimensions, cosine on odd ones. (Many codebases concatenate
    [sin | cos] instead: a permutation of the dimensions, not the paper's form.)

    Args:
      positions: integer array of any shape `(...)`. Packed rows restart at 0 in
        each segment; a decoding step asks for a single position.
      d_model: the model width D, the size of the encoding.
      max_timescale: the 10000 of the formula.

    Returns:
      float32 array `(..., d_model)`.
    """
    d_model = positive_int("d_model", d_model)
    max_timescale = finite_number("max_timescale", max_timescale, strict=True)  # paper: 10000
    positions = jnp.asarray(positions)
    dims_D = jnp.arange(d_model)
    two_i_D = (dims_D // 2) * 2  # 2i, shared by the sin/cos pair (2i, 2i+1)
    inv_timescale_D = jnp.power(max_timescale, -two_i_D / d_model).astype(jnp.float32)
    # Explicit reshapes keep this valid under jax_numpy_rank_promotion="raise".
    broadcast_shape = (1,) * positions.ndim + (d_model,)
    angles = positions.astype(jnp.float32)[..., None] * inv_timescale_D.reshape(broadcast_shape)
    is_even = (dims_D % 2 == 0).reshape(broadcast_shape)
    return jnp.where(is_even, jnp.sin(angles), jnp.cos(angles))
