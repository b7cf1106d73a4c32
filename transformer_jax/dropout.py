"""Dropout (§5.4, "Residual Dropout"; Srivastava et al., 2014) from fewer random bits.

    y = where(u >= round(p · 2^bits), x / (1 - p'), 0),   u uniform in [0, 2^bits)

Each element is zeroed with probability p' = round(p · 2^bits) / 2^bits and the rest are
scaled by 1 / (1 - p') in float32, so E[y] = x up to rounding y to x's dtype. Pure JAX, no
Flax (the module is `layers.Dropout`). With the default 16 bits, p' is within 2^-17
of the paper's P_drop (0.1 → 0.100006); 8 bits give 0.1 → 0.1016.

Written here rather than taken from `flax.linen.Dropout`, whose mask is `jax.random.bernoulli`:
one 32-bit threefry draw per element (JAX's partitionable threefry spends a whole draw on
each element even when asked for 8 or 16 bits). This one takes each 32-bit draw apart into
2 (16 bits) or 4 (8 bits) decisions, so it runs threefry 2 or 4 times less. The train step
of the small and base models on the 2-core CPU: 1.05 × faster with 16 bits than with 32,
1.07 × with 8 (BENCHMARKS.md, "dropout"); on an H200 the three are within 3 % ("GPU: H200,
2026-11-27"). `--config.model.dropout_bits` picks.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer_jax.argument_checks import DEFAULT_BITS, DROPOUT_BITS, checked_rate


def dropout(x, rate: float, key, *, bits: int = DEFAULT_BITS):
    """Dropout (§5.4): `x` with each element zeroed with probability `rate` (rounded to `bits`
    bits) and the rest scaled by 1 / (1 - rate) to keep the expectation (the module's
    docstring has the formula); `key` is a JAX PRNG key. `rate` 0 returns `x`."""
    if bits not in DROPOUT_BITS:
        raise ValueError(f"dropout bits must be one of {DROPOUT_BITS}, got {bits!r}")
    rate = checked_rate("dropout rate", rate, bits)
    if rate == 0.0:
        return x
    if key is None:
        raise ValueError(f"dropout at rate {rate} needs a PRNG key, e.g. jax.random.key(0)")
    key_dtype = getattr(key, "dtype", None)
    if key_dtype is None or not (jax.dtypes.issubdtype(key_dtype, jax.dtypes.prng_key)
                                 or key_dtype == np.uint32):  # a typed key, or a raw one
        raise TypeError(f"dropout's key must be a JAX PRNG key, e.g. jax.random.key(0), "
                        f"got {key!r}")
    if jnp.ndim(key) != (0 if key_dtype != np.uint32 else 1):  # a batch of keys: vmap takes it
        raise ValueError(f"dropout takes one PRNG key, got keys of shape {jnp.shape(key)}; "
                         f"jax.vmap dropout over them, or pass one of them")
    if not hasattr(x, "dtype"):
        raise TypeError(f"dropout's x must be an array, got a {type(x).__name__} (jnp.asarray "
                        f"makes one)")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"dropout scales x by 1 / (1 - rate): x must be floating point, "
                        f"got {x.dtype}")
    threshold = round(rate * 2**bits)
    u = _uniform_bits(key, x.shape, np.dtype(f"uint{bits}"))
    keep = u >= np.asarray(threshold, u.dtype)
    scale = np.float32(2**bits / (2**bits - threshold))  # 1 / (1 - p')
    # Scaled in float32, then rounded once: a bfloat16 scale would be off by up to 0.4 %.
    kept = (x.astype(jnp.float32) * scale).astype(x.dtype)
    return lax.select(keep, kept, lax.full_like(x, 0))


def _uniform_bits(key, shape: tuple, dtype: np.dtype):
    """Uniform unsigned integers of `dtype` in `shape`, 32 // bits of them from each 32-bit
    draw, neighbours along the last axis."""
    per_word = 4 // dtype.itemsize
    *lead, last = shape if shape else (1,)
    words = jax.random.bits(key, (*lead, -(-last // per_word)), np.uint32)
    if per_word > 1:
        words = lax.bitcast_convert_type(words, dtype)
        words = words.reshape(*lead, words.shape[-2] * per_word)[..., :last]
    return words.reshape(shape)
