"""The tied output layer (§3.4) and the smoothed loss (§5.4) without the whole logits.

    loss_sum, weight_sum, correct_sum = output_loss(features, table, targets, weights,
                                                    label_smoothing=0.1, chunk_size=4096)

is `label_smoothed_cross_entropy` and `accuracy` of the logits `features @ table.T`, computed
`chunk_size` rows (target tokens) at a time: no `(B·T, V)` array is ever whole, forward or
backward. For the paper's 25,000-token batches and 37,000-token vocabulary the logits are
3.7 GB in float32, read and written several times per step by the softmax, the loss, the
accuracy and their gradients; here a chunk of 4,096 rows is 0.6 GB, and lives only inside
one iteration of a `lax.scan`.

The gradient is a custom VJP that does its work in the forward pass, while each chunk's
logits are at hand (as Liger Kernel's fused linear cross-entropy does): for each chunk it
computes the softmax, dlogits = weight · (softmax − q), q the smoothed target, writes
dfeatures = dlogits @ table for the chunk and adds dlogits^T @ features into the table's
gradient. The backward pass only scales the two by the loss's cotangent. So a
differentiated step runs three logit-sized matmuls per chunk, as the whole logits do; an
earlier version kept each chunk's log-normalizer and computed its logits again in the
backward pass, four matmuls (BENCHMARKS.md, "the output layer and loss in chunks"). A call
that is not differentiated (evaluation) computes no gradient. Written by hand because no
well-kept library computes this loss: optax and flax have no chunked or fused
projection-and-loss; tokamax's `linear_softmax_cross_entropy_loss` (0.0.17) has neither
label smoothing nor token weights nor the accuracy, and its memory-saving "chunked_xla"
ran 2.1 × slower than this on an H200; JAX's own autodiff of a scan would keep every
chunk's logits for the backward pass.

In this module's names K counts chunks and C a chunk's rows (elsewhere beam and cache
length): `x_KCD` is K chunks of C rows of D features.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.argument_checks import positive_int
from transformer_jax.losses import (is_correct, logit_terms, smoothed_loss, smoothed_target,
                                    target_mask)
from transformer_jax.token_ids import PAD_ID, check_ids


def output_loss(features, table, targets, weights=None, *, label_smoothing: float = 0.0,
                chunk_size: int = 4096, dtype=None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Σ weight · loss, Σ weight and Σ weight · [argmax = target] of the tied logits.

    Args:
      features: `(..., D)`, the decoder's output (after its final norm, if any).
      table: `(V, D)`, the shared embedding matrix (§3.4): logits = features @ table.T.
      targets: int `(...)`, token ids in [0, V).
      weights: `(...)`; default `targets != 0` (0 is padding).
      label_smoothing: ε of §5.4.
      chunk_size: about this many rows (target tokens) per chunk: ⌈L·T / chunk_size⌉
        chunks (L rows of T tokens: targets' leading axes and last), each of the same Tc
        positions of every row, T padded with tokens of weight 0 to a multiple of Tc. A
        chunk has at most chunk_size + L rows (at least a token of each row).
      dtype: the matmuls' input dtype (the model's compute dtype; default: features').
        Products accumulate in float32 and the logits are rounded to `dtype`, as the
        whole-logits path's are (`Transformer.decode`); the softmax runs in float32.

    Returns float32 scalars, as `losses.label_smoothed_cross_entropy` and
    `losses.accuracy` on those logits return them.
    """
    features, targets = jnp.asarray(features), jnp.asarray(targets)
    check_ids(targets, "targets", table.shape[0])
    if features.shape[:-1] != targets.shape or table.shape[-1] != features.shape[-1]:
        raise ValueError(f"features {features.shape} must be targets {targets.shape} + (D,) "
                         f"with table (V, D), got table {table.shape}")
    if weights is None:
        weights = (targets != PAD_ID).astype(jnp.float32)
    chunk_size = positive_int("chunk_size", chunk_size)
    smoothed_target(label_smoothing, table.shape[0])  # checks ε
    # Each chunk takes the same positions of every row (L rows of T tokens: the leading axes
    # and the last), so that a batch split over devices by rows (`sharded`) is split so in
    # every chunk. Chunks of consecutive tokens each lay on one device or two: XLA gathered
    # them, and every device computed every chunk.
    rows, length = (math.prod(targets.shape[:-1]), targets.shape[-1]) if targets.ndim else (1, 1)
    asked = min(-(-rows * length // chunk_size), length)  # ⌈L·T / chunk_size⌉, at most T
    per_row = -(-length // asked)  # Tc: ⌈T / asked⌉ positions of each row a chunk
    num_chunks = -(-length // per_row)  # K: ⌈T / Tc⌉, no chunk of padding alone

    def chunked(x, fill=0):  # (..., T) or (..., T, D) -> (K, L·Tc) or (K, L·Tc, D)
        x = x.reshape((rows, length) + x.shape[targets.ndim:])
        pad = [(0, 0), (0, num_chunks * per_row - length)] + [(0, 0)] * (x.ndim - 2)
        x = jnp.pad(x, pad, constant_values=fill)
        x = x.reshape((rows, num_chunks, per_row) + x.shape[2:]).swapaxes(0, 1)
        return x.reshape((num_chunks, rows * per_row) + x.shape[3:])

    dtype = jnp.dtype(dtype or features.dtype)
    return _output_loss(chunked(features), table, chunked(targets, PAD_ID),
                        chunked(jnp.asarray(weights, jnp.float32)), label_smoothing, dtype)


def _logits(x_CD, table_VD, dtype):
    """One chunk's logits `(C, V)` in `dtype`, as the whole-logits path makes them: in
    bfloat16 each pass over them moves half the bytes of float32 logits. (They were float32
    when an H200 timed the chunks 0.89 x as fast as the whole logits in the train step.)"""
    return jnp.einsum("CD,VD->CV", x_CD.astype(dtype), table_VD.astype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _output_loss(x_KCD, table_VD, targets_KC, weights_KC, label_smoothing, dtype):
    return _chunks(x_KCD, table_VD, targets_KC, weights_KC, label_smoothing, dtype, False)[0]


def _forward(x_KCD, table_VD, targets_KC, weights_KC, label_smoothing, dtype):
    sums, grads = _chunks(x_KCD, table_VD, targets_KC, weights_KC, label_smoothing, dtype, True)
    dtypes = jnp.zeros(0, x_KCD.dtype), jnp.zeros(0, table_VD.dtype)  # residuals are arrays
    return sums, (grads, dtypes, weights_KC)


def _chunks(x_KCD, table_VD, targets_KC, weights_KC, label_smoothing, dtype, with_grads):
    """The three sums over all chunks; with `with_grads`, also the loss sum's gradients
    (features `(K, C, D)` and table `(V, D)`, float32), taken while each chunk's logits are
    in hand."""
    vocab_size = table_VD.shape[0]
    confidence, low, _ = smoothed_target(label_smoothing, vocab_size)
    table_cast_VD = table_VD.astype(dtype)  # once, not once per chunk

    def one_chunk(carry, chunk):
        sums, dtable_VD = carry
        x_CD, targets_C, weights_C = chunk
        logits_CV = _logits(x_CD, table_cast_VD, dtype)
        terms = logit_terms(logits_CV, targets_C)
        loss_C = smoothed_loss(terms, vocab_size, label_smoothing)
        sums = (sums[0] + (loss_C * weights_C).sum(), sums[1] + weights_C.sum(),
                sums[2] + (is_correct(terms, targets_C) * weights_C).sum())
        if not with_grads:
            return (sums, dtable_VD), None
        probs_CV = jnp.exp(logits_CV.astype(jnp.float32) - terms.logsumexp[:, None])
        q_CV = jnp.where(target_mask(targets_C, vocab_size), confidence, low)
        dlogits_CV = (weights_C[:, None] * (probs_CV - q_CV)).astype(dtype)
        dx_CD = jnp.einsum("CV,VD->CD", dlogits_CV, table_cast_VD,
                           preferred_element_type=jnp.float32)
        dtable_VD = dtable_VD + jnp.einsum("CV,CD->VD", dlogits_CV, x_CD.astype(dtype),
                                           preferred_element_type=jnp.float32)
        return (sums, dtable_VD), dx_CD

    zero = jnp.zeros((), jnp.float32)
    dtable_VD = jnp.zeros(table_VD.shape if with_grads else (), jnp.float32)
    (sums, dtable_VD), dx_KCD = jax.lax.scan(one_chunk, ((zero, zero, zero), dtable_VD),
                                             (x_KCD, targets_KC, weights_KC))
    return sums, (dx_KCD, dtable_VD)


def _backward(label_smoothing, dtype, residuals, cotangents):
    (dx_KCD, dtable_VD), (x_dtype, table_dtype), weights_KC = residuals
    g = cotangents[0]  # the counts' cotangents do not reach the inputs
    no_targets = np.zeros(weights_KC.shape, jax.dtypes.float0)
    return ((g * dx_KCD).astype(x_dtype.dtype), (g * dtable_VD).astype(table_dtype.dtype),
            no_targets, jnp.zeros_like(weights_KC))


_output_loss.defvjp(_forward, _backward)
