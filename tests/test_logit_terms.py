"""`losses.two_pass_logit_terms` (the default on GPUs): `losses.xla_logit_terms`' values and
gradients, against the library's reductions and float64 NumPy; and which one
`losses.logit_terms` runs on which backend."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from transformer_jax import losses
from transformer_jax.losses import first_largest, two_pass_logit_terms as logit_terms


def test_the_terms_at_the_papers_vocabulary_size():
    """V = 37,000 (the shared BPE vocabulary, §5.1): log Σ exp as jax.nn.logsumexp gives it,
    the argmax as jnp.argmax, the target's logit exactly, the sum within 1e-5 relative of
    float64 (one reduction adds a row in another order than jnp.sum); and the loss as
    `losses.xla_logit_terms` gives it."""
    rng = np.random.default_rng(11)
    x_NV = (rng.standard_normal((16, 37_000)) * 4 + 2).astype(np.float32)
    targets_N = rng.integers(0, 37_000, 16)
    terms = jax.jit(logit_terms)(x_NV, targets_N)
    assert_allclose(terms.logsumexp, jax.nn.logsumexp(x_NV, axis=-1), rtol=1e-7)
    np.testing.assert_array_equal(terms.argmax, np.argmax(x_NV, axis=-1))
    np.testing.assert_array_equal(terms.target, x_NV[np.arange(16), targets_N])
    assert_allclose(terms.total, x_NV.astype(np.float64).sum(-1), rtol=1e-5)
    loss = losses.smoothed_loss(terms, 37_000, 0.1)
    expected = losses.smoothed_loss(losses.xla_logit_terms(x_NV, targets_N), 37_000, 0.1)
    assert_allclose(loss, expected, rtol=1e-5)


def test_rows_with_infinities_and_nans_are_jax_nns():
    """Rows of -inf (a masked vocabulary), +inf and NaN: log Σ exp is jax.nn.logsumexp's and
    the argmax jnp.argmax's (a NaN, else the first of the largest)."""
    inf, nan = np.inf, np.nan
    x_NV = np.array([[-inf, -inf, -inf, -inf], [1.0, -inf, 3.0, 3.0], [inf, 2.0, inf, 0.0],
                     [1.0, 2.0, 5.0, nan], [nan, 1.0, 2.0, 3.0], [-inf, 0.5, -inf, 0.5]],
                    np.float32)
    terms = logit_terms(x_NV, np.array([1, 2, 0, 3, 0, 3]))
    np.testing.assert_array_equal(terms.logsumexp, jax.nn.logsumexp(x_NV, axis=-1))
    np.testing.assert_array_equal(terms.argmax, jnp.argmax(x_NV, axis=-1))
    np.testing.assert_array_equal(terms.argmax, [0, 2, 0, 3, 0, 1])


def test_rows_of_negative_logits_only():
    """Every logit below 0, some far below: log Σ exp is jax.nn.logsumexp's (finite, near
    the largest logit) and the argmax np.argmax's, not column 0."""
    x_NV = np.array([[-1000.0, -999.0, -1001.0, -999.5], [-5.0, -3.0, -4.0, -3.5],
                     [-0.25, -0.5, -0.125, -2.0]], np.float32)
    terms = logit_terms(x_NV, np.array([0, 1, 3]))
    assert_allclose(terms.logsumexp, jax.nn.logsumexp(x_NV, axis=-1), rtol=1e-6)
    np.testing.assert_array_equal(terms.argmax, [1, 1, 2])
    np.testing.assert_array_equal(terms.target, [-1000.0, -3.0, -2.0])


def test_the_argmax_combination_does_not_depend_on_the_order():
    """XLA may combine partial results in any order (a GPU's reduction combines trees of
    them): choosing between two (value, index) pairs gives the same pair either way round,
    the one np.argmax picks from the two values at those indices (two NaNs included)."""
    values = [-np.inf, -1.0, 0.0, 2.0, np.inf, np.nan]
    for a_value, b_value, (a_index, b_index) in itertools.product(values, values,
                                                                  [(0, 1), (1, 0)]):
        a = (jnp.float32(a_value), jnp.int32(a_index))
        b = (jnp.float32(b_value), jnp.int32(b_index))
        row = np.zeros(2, np.float32)
        row[[a_index, b_index]] = a_value, b_value
        for value, index in (first_largest(a, b), first_largest(b, a)):
            assert int(index) == int(np.argmax(row)), (a_value, b_value, a_index)
            np.testing.assert_array_equal(value, row[int(np.argmax(row))])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_gradient_is_the_library_reductions(dtype):
    """The hand-written gradient of log Σ exp, the target's logit and the sum, for any
    cotangents, is JAX's own of jax.nn.logsumexp, a masked sum and jnp.sum, in the logits'
    dtype."""
    rng = np.random.default_rng(12)
    logits_BTV = jnp.asarray(rng.standard_normal((2, 3, 7)) * 3, dtype)
    targets_BT = jnp.asarray(rng.integers(0, 7, (2, 3)))
    cotangents = tuple(rng.standard_normal((3, 2, 3)).astype(np.float32))

    def library(x):
        x32 = x.astype(jnp.float32)
        target = jnp.where(jax.nn.one_hot(targets_BT, 7) > 0, x32, 0.0).sum(-1)
        return jax.nn.logsumexp(x32, axis=-1), target, x32.sum(-1)

    def ours(x):
        terms = logit_terms(x, targets_BT)
        return terms.logsumexp, terms.target, terms.total

    (grad,) = jax.vjp(ours, logits_BTV)[1](cotangents)
    (expected,) = jax.vjp(library, logits_BTV)[1](cotangents)
    assert grad.dtype == dtype
    assert_allclose(np.asarray(grad, np.float32), np.asarray(expected, np.float32),
                    rtol=1e-5 if dtype == jnp.float32 else 1e-2, atol=1e-6)


@pytest.mark.parametrize("backend, custom_vjp", [("gpu", True), ("cpu", False), ("tpu", False)])
def test_the_backend_chooses_the_reductions(monkeypatch, backend, custom_vjp):
    """GPUs run the two passes (a custom VJP in the program), CPUs and TPUs XLA's reductions;
    the terms are the same either way."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    x_NV = np.random.default_rng(13).standard_normal((3, 11)).astype(np.float32)
    targets_N = np.array([0, 4, 10])
    # A new function each time: JAX caches traces by function, not by backend.
    program = str(jax.make_jaxpr(lambda x, t: losses.logit_terms(x, t))(x_NV, targets_N))
    assert ("custom_vjp_call" in program) == custom_vjp
    terms = losses.logit_terms(x_NV, targets_N)
    np.testing.assert_array_equal(terms.argmax, np.argmax(x_NV, axis=-1))
    assert_allclose(terms.logsumexp, jax.nn.logsumexp(x_NV, axis=-1), rtol=1e-6)
