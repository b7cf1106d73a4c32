"""`losses.logit_terms` in two passes over the logits: a candidate, timed beside it by the
`loss` suite ("2 passes") until an accelerator decides.

`losses.logit_terms` leaves the reductions over V to XLA: `jax.nn.logsumexp` (the largest
logit, then Σ exp), `jnp.argmax`, the sum and the target's logit, each a reduction of its
own unless XLA merges them; on an H100 the base step ran four reduction kernels over its
25,000 × 37,000 logits, 8.1 % of its time (BENCHMARKS.md, "Where the train step's time
goes"). Here they are two by construction: one variadic `lax.reduce` takes each row's
largest logit with its first index, the sum and the target's logit; a second Σ exp(logit -
largest). The gradient is one elementwise pass (a custom VJP: `lax.reduce` has none) that
computes the softmax again rather than keeping it.

On the 2-core CPU it does not pay (BENCHMARKS.md, "loss: the logits' reductions in two
passes"): XLA's CPU backend keeps exp(logit - largest) from the forward pass for the
gradient, where this computes it twice, and exp is what a CPU spends its time on here. On
an H200 it is 1.10 × the whole logits' time alone (7.60 against 8.34 ms; BENCHMARKS.md,
"GPU: H200, 2026-11-27"), 2 % of the base step: not yet timed in the step.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer_jax.losses import LogitTerms, target_mask


@jax.custom_vjp
def logit_terms(logits, targets) -> LogitTerms:
    """`losses.logit_terms`, the same values (the sum to float32 rounding in another
    order), in two reductions over V. The gradient: d/dlogit_v = g_logsumexp · softmax_v +
    g_total + g_target · [v = y]; reverse mode only (a `custom_vjp`: `jax.jvp` and
    `jax.jacfwd` refuse it, where `losses.logit_terms` takes them)."""
    return _terms(logits, targets)


def _terms(logits, targets) -> LogitTerms:
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


def _forward(logits, targets):
    terms = _terms(logits, targets)
    return terms, (logits, targets, terms.logsumexp)


def _backward(residuals, g: LogitTerms):
    logits, targets, logsumexp = residuals
    x = logits.astype(jnp.float32)
    softmax = jnp.exp(x - logsumexp[..., None])
    at_target = jnp.where(target_mask(targets, x.shape[-1]), g.target[..., None], 0.0)
    dlogits = g.logsumexp[..., None] * softmax + g.total[..., None] + at_target
    return dlogits.astype(logits.dtype), np.zeros(targets.shape, jax.dtypes.float0)


logit_terms.defvjp(_forward, _backward)
