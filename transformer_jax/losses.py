"""Label-smoothed cross-entropy (§5.4) and token accuracy, as weighted sums.

Pure JAX, no Flax. Both functions return `(sum, weight_sum)` rather than a mean,
so that sums from several devices or batches can be added and divided once.
Padding targets (`token_ids.PAD_ID`, 0) get weight 0 by default.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer_jax.argument_checks import fraction
from transformer_jax.token_ids import PAD_ID, check_ids


def label_smoothed_cross_entropy(
    logits, targets, weights=None, *, label_smoothing: float = 0.1
) -> tuple[jax.Array, jax.Array]:
    """Weighted cross-entropy against a label-smoothed target (§5.4, ε_ls = 0.1 by default).

    The target distribution q (tensor2tensor / Flax WMT form) puts

        q_y = 1 - ε on the true token y,   q_v = ε / (V - 1) on every other v.

    (The paper cites Szegedy et al. [36], whose q spreads ε over all V tokens, the true
    one included: q_y = 1 - ε + ε/V, q_v = ε/V. The form here is that of tensor2tensor,
    the code the paper names for its models; the two differ by at most ε/V in any q_v.)

    The loss of one token subtracts the entropy of q, so that predicting q
    exactly costs 0:

        loss = -Σ_v q_v log softmax(logits)_v - H(q),
        H(q) = -((1 - ε) log(1 - ε) + (V - 1) · ε/(V - 1) · log(ε/(V - 1) + 1e-20)).

    With ε = 0 this is plain cross-entropy. Padding targets are smoothed like any
    other token; their weight of 0 removes them.

    Args:
      logits: `(B, T, V)`, any float dtype; the softmax runs in float32.
      targets: int `(B, T)`, token ids in [0, V).
      weights: `(B, T)`; default `targets != 0` (0 is padding).
      label_smoothing: ε, a Python float in [0, 1): the paper's 0.1 unless given (0.0
        is plain cross-entropy).

    Returns:
      `(loss_sum, weight_sum)`, float32 scalars: Σ weight · loss and Σ weight.
    """
    logits_BTV, targets_BT, weights_BT = _checked(logits, targets, weights)
    terms = logit_terms(logits_BTV, targets_BT)
    loss_BT = smoothed_loss(terms, logits_BTV.shape[-1], label_smoothing)
    return (loss_BT * weights_BT).sum(), weights_BT.sum()


def accuracy(logits, targets, weights=None) -> tuple[jax.Array, jax.Array]:
    """Weighted count of tokens whose argmax logit is the target: `logits` `(B, T, V)`,
    `targets` and `weights` `(B, T)`.

    Returns `(correct_sum, weight_sum)`, float32 scalars; weights default to
    `targets != 0` as in `label_smoothed_cross_entropy`.
    """
    logits_BTV, targets_BT, weights_BT = _checked(logits, targets, weights)
    correct_BT = is_correct(logit_terms(logits_BTV, targets_BT), targets_BT)
    return (correct_BT * weights_BT).sum(), weights_BT.sum()


class LogitTerms(NamedTuple):
    """The reductions over V of each token's logits that its loss and accuracy need, one
    value per token `(...)`."""

    logsumexp: jax.Array  # log Σ_v exp(logit_v), float32
    target: jax.Array  # logit_y of the target y, float32
    total: jax.Array  # Σ_v logit_v, float32
    argmax: jax.Array  # the first v of the largest logit, int32 (jnp.argmax's)


def logit_terms(logits, targets) -> LogitTerms:
    """`LogitTerms` of `logits` `(..., V)` (any float dtype, reduced in float32) for
    `targets` `(...)`: on GPUs `two_pass_logit_terms`, elsewhere `xla_logit_terms`.

    The same values either way (the sum to float32 rounding in another order). Side by side
    in base's train step (bfloat16, 96 packed rows × 256, whole logits), the two passes
    took 38.9 ms against 39.9 on an H100 (1.02 ×; BENCHMARKS.md, "GPU: H100, 2026-11-27");
    on the 2-core CPU they were 0.97-0.99 × (XLA's CPU backend keeps exp(logit - largest)
    for the gradient, which they compute again). TPUs keep XLA's: not measured there.
    """
    if jax.default_backend() == "gpu":
        return two_pass_logit_terms(logits, targets)
    return xla_logit_terms(logits, targets)


def xla_logit_terms(logits, targets) -> LogitTerms:
    """`logit_terms` as reductions only, which XLA fuses into passes over the logits as it
    chooses (four on an H100: the largest logit, Σ exp, the argmax, the sums).

    No array of the logits' size is made (log-probabilities would be gigabytes per step for
    V = 37,000). The target's logit is a masked sum, not a gather: its gradient is then
    elementwise, where a gather's would be a scatter into a (..., V) buffer.
    """
    logits, vocab_size = logits.astype(jnp.float32), logits.shape[-1]
    target = jnp.where(target_mask(targets, vocab_size), logits, 0.0).sum(axis=-1)
    return LogitTerms(logsumexp=jax.nn.logsumexp(logits, axis=-1), target=target,
                      total=logits.sum(axis=-1),
                      argmax=jnp.argmax(logits, axis=-1).astype(jnp.int32))


@jax.custom_vjp
def two_pass_logit_terms(logits, targets) -> LogitTerms:
    """`logit_terms` in two passes over V by construction: one variadic `lax.reduce` takes
    each row's largest logit with its first index, the sum and the target's logit; a second
    Σ exp(logit - largest). The gradient (a custom VJP: `lax.reduce` has none) is one
    elementwise pass that computes the softmax again rather than keeping it:

        d/dlogit_v = g_logsumexp · softmax_v + g_total + g_target · [v = y]

    Reverse mode only: `jax.jvp` and `jax.jacfwd` refuse it, where `xla_logit_terms` takes
    them.
    """
    return _two_pass_terms(logits, targets)


def _two_pass_terms(logits, targets) -> LogitTerms:
    x = logits.astype(jnp.float32)
    largest, argmax, total, target = _largest_total_target(x, targets)
    shift = jnp.where(jnp.isfinite(largest), largest, 0.0)  # jax.nn.logsumexp's, for ±inf rows
    logsumexp = jnp.log(jnp.exp(x - shift[..., None]).sum(axis=-1)) + shift
    return LogitTerms(logsumexp=logsumexp, target=target, total=total, argmax=argmax)


def _largest_total_target(x, targets):
    """(max, first argmax, sum, the target's entry) over the last axis of float32 `x`, in
    one reduction."""
    vocab = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    at_target = jnp.where(target_mask(targets, x.shape[-1]), x, 0.0)

    def combine(a, b):
        (a_max, a_arg, a_sum, a_target), (b_max, b_arg, b_sum, b_target) = a, b
        return (*first_largest((a_max, a_arg), (b_max, b_arg)), a_sum + b_sum,
                a_target + b_target)

    zero = jnp.float32(0)
    return lax.reduce((x, vocab, x, at_target), (jnp.float32(-jnp.inf), jnp.int32(0), zero, zero),
                      combine, (x.ndim - 1,))


def first_largest(a, b):
    """Of two (value, index) pairs, the larger value, a NaN before any number, and of equal
    values (or two NaNs) the lower index: `jnp.argmax`'s choice, whichever way round XLA
    combines them (a GPU's reduction combines trees of partial results)."""
    (a_value, a_index), (b_value, b_index) = a, b
    a_nan, b_nan = jnp.isnan(a_value), jnp.isnan(b_value)
    tied = (a_value == b_value) | (a_nan & b_nan)
    take_a = (a_value > b_value) | (a_nan & ~b_nan) | (tied & (a_index < b_index))
    return jnp.where(take_a, a_value, b_value), jnp.where(take_a, a_index, b_index)


def _two_pass_forward(logits, targets):
    terms = _two_pass_terms(logits, targets)
    return terms, (logits, targets, terms.logsumexp)


def _two_pass_backward(residuals, g: LogitTerms):
    logits, targets, logsumexp = residuals
    x = logits.astype(jnp.float32)
    softmax = jnp.exp(x - logsumexp[..., None])
    at_target = jnp.where(target_mask(targets, x.shape[-1]), g.target[..., None], 0.0)
    dlogits = g.logsumexp[..., None] * softmax + g.total[..., None] + at_target
    return dlogits.astype(logits.dtype), np.zeros(targets.shape, jax.dtypes.float0)


two_pass_logit_terms.defvjp(_two_pass_forward, _two_pass_backward)


def target_mask(targets, vocab_size: int) -> jax.Array:
    """`(..., V)` bool, True at each token's target id."""
    vocab = jnp.arange(vocab_size).reshape((1,) * targets.ndim + (vocab_size,))
    return vocab == targets[..., None]


def smoothed_loss(terms: LogitTerms, vocab_size: int, label_smoothing: float) -> jax.Array:
    """Each token's `-Σ_v q_v log p_v - H(q)` (see `label_smoothed_cross_entropy`) from its
    `terms`: log p_v = logit_v - logsumexp, so Σ_v q_v log p_v = low · Σ_v log p_v
    + (confidence - low) · log p_y."""
    confidence, low, entropy = smoothed_target(label_smoothing, vocab_size)
    sum_logp = terms.total - vocab_size * terms.logsumexp
    cross_entropy = -(low * sum_logp + (confidence - low) * (terms.target - terms.logsumexp))
    return cross_entropy - jnp.float32(entropy)


def is_correct(terms: LogitTerms, targets) -> jax.Array:
    """1.0 where the argmax of the logits is the target, else 0.0 (float32)."""
    return (terms.argmax == targets).astype(jnp.float32)


def smoothed_target(label_smoothing: float, vocab_size: int) -> tuple[float, float, float]:
    """(1 - ε, ε / (V - 1), H(q)): the smoothed target q of `label_smoothed_cross_entropy`
    (its weight on the true token, on every other token, and its entropy)."""
    label_smoothing = fraction("label_smoothing", label_smoothing)
    if label_smoothing > 0.0 and vocab_size < 2:
        raise ValueError(f"label smoothing needs a vocabulary of 2 or more, got V={vocab_size}")
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1) if vocab_size > 1 else 0.0
    entropy = -(
        confidence * math.log(confidence) + (vocab_size - 1) * low * math.log(low + 1e-20)
    )
    return confidence, low, entropy


def _checked(logits_BTV, targets_BT, weights_BT):
    """Arrays with agreeing shapes, integer targets in [0, V) (`check_ids`); weights
    float32, `targets_BT != 0` by default."""
    logits_BTV, targets_BT = jnp.asarray(logits_BTV), jnp.asarray(targets_BT)
    if not jnp.issubdtype(targets_BT.dtype, jnp.integer):  # before the shapes: say why
        hint = (" (logits and targets swapped? logits (B, T, V) first)"
                if jnp.issubdtype(logits_BTV.dtype, jnp.integer) else
                " (one-hot targets? pass their argmax)"
                if targets_BT.shape == logits_BTV.shape else "")
        raise TypeError(f"targets must be integer ids, got {targets_BT.dtype}{hint}")
    if logits_BTV.shape[:-1] != targets_BT.shape:  # first: without V, the ids' check misleads
        raise ValueError(
            f"logits shape {logits_BTV.shape} must be targets shape {targets_BT.shape} + (V,)"
        )
    check_ids(targets_BT, "targets", logits_BTV.shape[-1])
    if weights_BT is None:
        return logits_BTV, targets_BT, (targets_BT != PAD_ID).astype(jnp.float32)
    weights_BT = jnp.asarray(weights_BT, jnp.float32)
    if weights_BT.shape != targets_BT.shape:
        raise ValueError(
            f"weights shape {weights_BT.shape} must equal targets shape {targets_BT.shape}"
        )
    return logits_BTV, targets_BT, weights_BT
