"""The chunked output layer and loss: equal to the whole-logits loss, accuracy and gradients,
with no (rows, V) array in the computation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from transformer_jax.losses import accuracy, label_smoothed_cross_entropy
from transformer_jax.output_loss import output_loss

# Distinct primes: 3 rows of 7 targets = 21 tokens, d_model 5, a vocabulary of 11.
B, T, D, V = 3, 7, 5, 11


def problem(seed=0):
    """Features, table, targets (row 2 ends with padding) and packed-row weights."""
    rng = np.random.default_rng(seed)
    features_BTD = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    table_VD = jnp.asarray(rng.standard_normal((V, D)), jnp.float32)
    targets_BT = rng.integers(1, V, (B, T))
    targets_BT[2, 4:] = 0
    return features_BTD, table_VD, jnp.asarray(targets_BT)


def whole(features_BTD, table_VD, targets_BT, weights_BT=None, label_smoothing=0.0):
    """Today's path: the (B, T, V) logits, then the loss and the accuracy on them."""
    logits_BTV = jnp.einsum("BTD,VD->BTV", features_BTD, table_VD)
    loss_sum, weight_sum = label_smoothed_cross_entropy(logits_BTV, targets_BT, weights_BT,
                                                        label_smoothing=label_smoothing)
    correct_sum, _ = accuracy(logits_BTV, targets_BT, weights_BT)
    return loss_sum, weight_sum, correct_sum


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 21, 64])  # 21 rows: uneven, exact, bigger
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_sums_and_gradients_equal_the_whole_logits(chunk_size, label_smoothing):
    features, table, targets = problem()
    chunked = jax.value_and_grad(
        lambda f, t: output_loss(f, t, targets, label_smoothing=label_smoothing,
                                 chunk_size=chunk_size)[0], argnums=(0, 1))
    reference = jax.value_and_grad(
        lambda f, t: whole(f, t, targets, label_smoothing=label_smoothing)[0], argnums=(0, 1))
    (loss, grads), (expected, expected_grads) = chunked(features, table), reference(features,
                                                                                     table)
    assert_allclose(loss, expected, rtol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)
    counts = output_loss(features, table, targets, label_smoothing=label_smoothing,
                         chunk_size=chunk_size)
    assert_allclose(counts, whole(features, table, targets, label_smoothing=label_smoothing),
                    rtol=1e-5)
    assert counts[1] == 21 - 3  # three padding targets weigh nothing


def test_weights_of_packed_rows_scale_tokens_and_gradients():
    """Explicit weights (packed rows: 0 between examples, any value elsewhere)."""
    features, table, targets = problem(1)
    weights = jnp.asarray(np.random.default_rng(2).uniform(0, 2, (B, T)), jnp.float32)
    weights = weights.at[0, 3].set(0.0)
    loss = lambda f, t, fn: fn(f, t)[0]  # noqa: E731
    chunked = lambda f, t: output_loss(f, t, targets, weights, label_smoothing=0.1,  # noqa
                                       chunk_size=5)
    reference = lambda f, t: whole(f, t, targets, weights, label_smoothing=0.1)  # noqa: E731
    assert_allclose(chunked(features, table), reference(features, table), rtol=1e-5)
    for fn_grad, ref_grad in zip(jax.grad(loss, (0, 1))(features, table, chunked),
                                 jax.grad(loss, (0, 1))(features, table, reference)):
        assert_allclose(fn_grad, ref_grad, rtol=1e-5, atol=1e-6)


def test_gradients_scale_with_the_cotangent_of_the_loss():
    """The gradients are computed in the forward pass for a cotangent of 1 and scaled in the
    backward pass: a mean loss (cotangent 1 / Σ weight) and a scaled one match autodiff."""
    features, table, targets = problem(3)

    def mean(fn):
        def loss(f, t):
            loss_sum, weight_sum = fn(f, t)[:2]
            return 2.5 * loss_sum / weight_sum
        return jax.grad(loss, argnums=(0, 1))

    chunked = mean(lambda f, t: output_loss(f, t, targets, label_smoothing=0.1, chunk_size=6))
    reference = mean(lambda f, t: whole(f, t, targets, label_smoothing=0.1))
    for grad, expected in zip(chunked(features, table), reference(features, table)):
        assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def _matmuls(jaxpr) -> int:
    return sum(eqn.primitive.name == "dot_general" for eqn in _equations(jaxpr))


def test_a_differentiated_chunk_runs_three_matmuls_as_the_whole_logits_do():
    """Logits, dfeatures and dtable: the logits are not computed again for the backward pass;
    a call without a gradient (evaluation) runs the logits' matmul alone."""
    features, table, targets = problem()
    loss = lambda f, t: output_loss(f, t, targets, chunk_size=4)[0]  # noqa: E731
    assert _matmuls(jax.make_jaxpr(jax.grad(loss, (0, 1)))(features, table).jaxpr) == 3
    assert _matmuls(jax.make_jaxpr(loss)(features, table).jaxpr) == 1
    reference = lambda f, t: whole(f, t, targets)[0]  # noqa: E731
    assert _matmuls(jax.make_jaxpr(jax.grad(reference, (0, 1)))(features, table).jaxpr) == 3


def test_accuracy_counts_hand_made_argmaxes():
    """Features equal to table rows: each token's argmax is its own row (an identity-like
    table makes the logits' argmax known by hand)."""
    table = jnp.eye(V, D * 3, dtype=jnp.float32) * 5.0  # (V, 15): row v is 5·e_v
    chosen = jnp.array([[3, 4, 4, 9]])
    features = table[jnp.array([[3, 7, 4, 9]])]  # argmax: 3, 7, 4, 9
    _, weight_sum, correct_sum = output_loss(features, table, chosen, chunk_size=3)
    assert weight_sum == 4 and correct_sum == 3  # the second token is wrong


def test_no_array_of_the_whole_logits_is_made():
    """Forward and backward, the largest (rows, V)-shaped value is one chunk's: chunk_size
    4 over 3 rows of 7 tokens asks for ⌈21 / 4⌉ = 6 chunks, so each takes ⌈7 / 6⌉ = 2
    positions of every row, 3 · 2 = 6 rows (at most chunk_size + 3)."""
    features, table, targets = problem()
    grad = jax.grad(lambda f, t: output_loss(f, t, targets, chunk_size=4)[0], argnums=(0, 1))
    shapes = _all_shapes(jax.make_jaxpr(grad)(features, table).jaxpr)
    vocab_shaped = [s for s in shapes if s and s[-1] == V and len(s) >= 2]
    assert vocab_shaped and max(np.prod(s[:-1]) for s in vocab_shaped) == 6
    # The whole-logits path does make one, so the check can fail.
    shapes = _all_shapes(jax.make_jaxpr(lambda f: whole(f, table, targets)[0])(features).jaxpr)
    assert (B, T, V) in shapes


def _equations(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs inside it (a scan's body once)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def _all_shapes(jaxpr) -> set[tuple]:
    return {tuple(v.aval.shape) for eqn in _equations(jaxpr) for v in eqn.outvars
            if hasattr(v.aval, "shape")}


def test_bfloat16_operands_stay_near_float32():
    """dtype=bfloat16 runs the matmuls on bfloat16 operands with float32 sums: the loss is
    within bfloat16's rounding of the float32 one."""
    features, table, targets = problem()
    exact = output_loss(features, table, targets, label_smoothing=0.1, chunk_size=8)[0]
    rounded = output_loss(features, table, targets, label_smoothing=0.1, chunk_size=8,
                          dtype=jnp.bfloat16)[0]
    assert rounded.dtype == jnp.float32
    assert_allclose(rounded, exact, rtol=2e-2)
    grad = jax.grad(lambda t: output_loss(features, t, targets, chunk_size=8,
                                          dtype=jnp.bfloat16)[0])(table)
    assert grad.dtype == jnp.float32  # the parameter's dtype


def test_bfloat16_chunks_make_their_logits_in_bfloat16_as_the_whole_logits_path_does():
    """The model's whole-logits path makes its logits in the compute dtype
    (`Transformer.decode`); so do the chunks, forward and in the differentiated pass: half
    the bytes of float32 logits in every pass over them on a GPU. (Their values cannot be
    compared with the whole path's to bfloat16's rounding: XLA may keep the product's
    float32 where a convert to bfloat16 and back follows it, `xla_allow_excess_precision`.)"""
    features, table, targets = problem()

    def logit_dtypes(fn):
        jaxpr = jax.make_jaxpr(fn)(features, table).jaxpr
        return {str(v.aval.dtype) for v in _dot_outputs(jaxpr) if v.aval.shape[-1] == V}

    loss = lambda f, t, dtype: output_loss(f, t, targets, chunk_size=8, dtype=dtype)[0]  # noqa
    for dtype in (jnp.bfloat16, jnp.float32):
        bound = functools.partial(loss, dtype=dtype)
        assert logit_dtypes(bound) == {jnp.dtype(dtype).name}
        assert logit_dtypes(jax.grad(bound, (0, 1))) == {jnp.dtype(dtype).name}


def test_bfloat16_differentiated_chunks_multiply_bfloat16_operands_only():
    """dtype=bfloat16: every matmul of the differentiated chunks (logits, dfeatures and
    dtable) reads bfloat16 operands, the table cast once, as the whole-logits path's
    autodiff does; a float32 operand would run a float32 matmul."""
    features, table, targets = problem()

    def loss(features, table):
        return output_loss(features, table, targets, chunk_size=8, dtype=jnp.bfloat16)[0]

    jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1)))(features, table).jaxpr
    operands = [str(v.aval.dtype) for eqn in _equations(jaxpr)
                if eqn.primitive.name == "dot_general" for v in eqn.invars]
    assert len(operands) == 6 and set(operands) == {"bfloat16"}, operands


def _dot_outputs(jaxpr) -> list:
    return [v for eqn in _equations(jaxpr) if eqn.primitive.name == "dot_general"
            for v in eqn.outvars]


@pytest.mark.parametrize("bad, match", [
    (dict(chunk_size=0), "chunk_size must be a positive integer"),
    (dict(label_smoothing=1.0), "label_smoothing must be a number in"),
])
def test_bad_arguments_raise(bad, match):
    features, table, targets = problem()
    with pytest.raises(ValueError, match=match):
        output_loss(features, table, targets, **bad)
    with pytest.raises(ValueError, match="must be targets"):
        output_loss(features, table, targets[:, :3])
    with pytest.raises(ValueError, match=rf"^targets must be in \[0, {V}\) \(vocab_size\)"):
        output_loss(features, table, targets.at[1, 1].set(V))
    with pytest.raises(TypeError, match="^targets must be integer ids, got float32$"):
        output_loss(features, table, targets.astype(jnp.float32))
