"""Label-smoothed cross-entropy (§5.4) and accuracy against hand numbers and optax."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpy.testing import assert_allclose

from transformer_jax.losses import accuracy, label_smoothed_cross_entropy, logit_terms

# Distinct primes so that no transposed axis can pass by accident.
B, T, V = 2, 3, 7
EPS_LS = 0.1  # the paper's ε_ls


def random_logits_targets(seed=0):
    """Random logits and targets; row 1 ends with two padding tokens (id 0)."""
    rng = np.random.default_rng(seed)
    logits_BTV = rng.standard_normal((B, T, V)).astype(np.float32) * 3
    targets_BT = rng.integers(1, V, size=(B, T))
    targets_BT[1, 1:] = 0
    return jnp.asarray(logits_BTV), jnp.asarray(targets_BT)


def smoothed_targets_BTV(targets_BT, vocab_size, eps):
    """The target distribution q as a dense float64 array: 1 - ε on y, ε / (V - 1) elsewhere."""
    one_hot_BTV = np.eye(vocab_size)[np.asarray(targets_BT)]
    return one_hot_BTV * (1 - eps) + (1 - one_hot_BTV) * eps / (vocab_size - 1)


def log_softmax(xs):
    log_z = math.log(sum(math.exp(x) for x in xs))
    return [x - log_z for x in xs]


# --- hand-computed ------------------------------------------------------------

# V = 3, one row of two tokens with targets 2 and 1.
HAND_LOGITS = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]
HAND_TARGETS = [2, 1]


def hand_loss(position, eps):
    """-Σ_v q_v log p_v - H(q) for one position of HAND_LOGITS, with math only."""
    logp = log_softmax(HAND_LOGITS[position])
    y = HAND_TARGETS[position]
    confidence, low = 1 - eps, eps / 2
    cross_entropy = -sum((confidence if v == y else low) * logp[v] for v in range(3))
    entropy = -(confidence * math.log(confidence) + (2 * low * math.log(low) if eps else 0.0))
    return cross_entropy - entropy


@pytest.mark.parametrize("eps", [0.0, EPS_LS])
def test_hand_computed(eps):
    """Two tokens, V=3: the sum is the two hand losses; weight 0 drops the second."""
    logits_BTV = jnp.array([HAND_LOGITS])
    targets_BT = jnp.array([HAND_TARGETS])
    loss_sum, weight_sum = label_smoothed_cross_entropy(
        logits_BTV, targets_BT, label_smoothing=eps
    )
    assert loss_sum.dtype == jnp.float32 and loss_sum.shape == ()
    assert_allclose(float(loss_sum), hand_loss(0, eps) + hand_loss(1, eps), rtol=1e-6)
    assert float(weight_sum) == 2.0
    first_only, weight_sum = label_smoothed_cross_entropy(
        logits_BTV, targets_BT, jnp.array([[1.0, 0.0]]), label_smoothing=eps
    )
    assert_allclose(float(first_only), hand_loss(0, eps), rtol=1e-6)
    assert float(weight_sum) == 1.0


def test_hand_numbers_without_smoothing():
    """ε = 0: the first token's loss is log(e + e² + e^0.5) - 0.5."""
    assert_allclose(hand_loss(0, 0.0), math.log(math.e + math.e**2 + math.e**0.5) - 0.5)


# --- weights and padding ------------------------------------------------------


def test_padding_is_excluded():
    """Default weights count the non-pad tokens; logits at padded positions change nothing."""
    logits_BTV, targets_BT = random_logits_targets(seed=1)
    loss_sum, weight_sum = label_smoothed_cross_entropy(
        logits_BTV, targets_BT, label_smoothing=EPS_LS
    )
    assert float(weight_sum) == B * T - 2
    noise_BTV = 100.0 * jax.random.normal(jax.random.PRNGKey(0), (B, T, V))
    padded_BT1 = (targets_BT == 0)[..., None]
    changed_BTV = jnp.where(padded_BT1, logits_BTV + noise_BTV, logits_BTV)
    changed_sum, changed_weight_sum = label_smoothed_cross_entropy(
        changed_BTV, targets_BT, label_smoothing=EPS_LS
    )
    assert float(changed_sum) == float(loss_sum)
    assert float(changed_weight_sum) == float(weight_sum)
    changed_acc = [float(x) for x in accuracy(changed_BTV, targets_BT)]
    assert changed_acc == [float(x) for x in accuracy(logits_BTV, targets_BT)]


def test_explicit_weights_scale_each_token():
    """Weights multiply per-token losses: the sum equals Σ w_t · loss_t computed one at a time."""
    logits_BTV, targets_BT = random_logits_targets(seed=2)
    weights_BT = jnp.asarray(np.arange(1, B * T + 1, dtype=np.float32).reshape(B, T) / 4)
    loss_sum, weight_sum = label_smoothed_cross_entropy(
        logits_BTV, targets_BT, weights_BT, label_smoothing=EPS_LS
    )
    expected = 0.0
    for b in range(B):
        for t in range(T):
            one_hot_BT = jnp.zeros((B, T)).at[b, t].set(1.0)
            token_loss, _ = label_smoothed_cross_entropy(
                logits_BTV, targets_BT, one_hot_BT, label_smoothing=EPS_LS
            )
            expected += float(weights_BT[b, t]) * float(token_loss)
    assert_allclose(float(loss_sum), expected, rtol=1e-5)
    assert_allclose(float(weight_sum), float(weights_BT.sum()), rtol=1e-6)


# --- independent references ---------------------------------------------------


def test_no_smoothing_equals_optax():
    """ε = 0 is plain cross-entropy: optax's integer-label loss, weighted and summed."""
    logits_BTV, targets_BT = random_logits_targets(seed=3)
    weights_BT = (targets_BT != 0).astype(jnp.float32)
    expected = (optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT)
                * weights_BT).sum()
    loss_sum, _ = label_smoothed_cross_entropy(logits_BTV, targets_BT, label_smoothing=0.0)
    assert_allclose(float(loss_sum), float(expected), rtol=1e-6)


def test_smoothing_equals_numpy_float64():
    """ε = 0.1 matches a dense float64 -Σ_v q_v log softmax_v + Σ_v q_v log q_v."""
    logits_BTV, targets_BT = random_logits_targets(seed=4)
    x = np.asarray(logits_BTV, np.float64)
    logp_BTV = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    q_BTV = smoothed_targets_BTV(targets_BT, V, EPS_LS)
    loss_BT = -(q_BTV * logp_BTV).sum(-1) + (q_BTV * np.log(q_BTV)).sum(-1)
    expected = (loss_BT * (np.asarray(targets_BT) != 0)).sum()
    loss_sum, _ = label_smoothed_cross_entropy(logits_BTV, targets_BT, label_smoothing=EPS_LS)
    assert_allclose(float(loss_sum), expected, rtol=1e-5)


# --- properties ---------------------------------------------------------------


def test_minimum_is_zero_at_the_smoothed_target():
    """Logits log q (plus any per-token shift) give loss 0; any other logits give more."""
    _, targets_BT = random_logits_targets(seed=5)
    q_BTV = smoothed_targets_BTV(targets_BT, V, EPS_LS)
    shift_BT1 = np.random.default_rng(6).standard_normal((B, T, 1))
    best_BTV = jnp.asarray(np.log(q_BTV) + shift_BT1, jnp.float32)
    best, _ = label_smoothed_cross_entropy(best_BTV, targets_BT, label_smoothing=EPS_LS)
    assert abs(float(best)) < 1e-5
    for seed in range(5):
        noise_BTV = 0.3 * jax.random.normal(jax.random.PRNGKey(seed), (B, T, V))
        worse, _ = label_smoothed_cross_entropy(
            best_BTV + noise_BTV, targets_BT, label_smoothing=EPS_LS
        )
        assert float(worse) > float(best) + 1e-4


def test_bfloat16_logits_give_float32_sums():
    """bfloat16 logits: float32 sums, equal to float32 on the rounded logits, close to the exact."""
    logits_BTV, targets_BT = random_logits_targets(seed=7)
    half_BTV = logits_BTV.astype(jnp.bfloat16)
    loss_sum, weight_sum = label_smoothed_cross_entropy(
        half_BTV, targets_BT, label_smoothing=EPS_LS
    )
    assert loss_sum.dtype == jnp.float32 and weight_sum.dtype == jnp.float32
    rounded, _ = label_smoothed_cross_entropy(
        half_BTV.astype(jnp.float32), targets_BT, label_smoothing=EPS_LS
    )
    exact, _ = label_smoothed_cross_entropy(logits_BTV, targets_BT, label_smoothing=EPS_LS)
    assert_allclose(float(loss_sum), float(rounded), rtol=1e-6)
    assert_allclose(float(loss_sum), float(exact), rtol=1e-2)


@pytest.mark.parametrize("eps", [0.0, EPS_LS])
def test_gradient_is_softmax_minus_target(eps):
    """d loss_sum / d logits = weight · (softmax(logits) - q), in float64 NumPy."""
    logits_BTV, targets_BT = random_logits_targets(seed=8)
    weights_BT = jnp.asarray(np.array([[1.0, 0.5, 2.0], [1.0, 0.0, 0.0]], np.float32))

    def loss(logits):
        return label_smoothed_cross_entropy(logits, targets_BT, weights_BT, label_smoothing=eps)[0]

    grad_BTV = jax.grad(loss)(logits_BTV)
    x = np.asarray(logits_BTV, np.float64)
    softmax_BTV = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    q_BTV = smoothed_targets_BTV(targets_BT, V, eps)
    expected = np.asarray(weights_BT)[..., None] * (softmax_BTV - q_BTV)
    assert_allclose(np.asarray(grad_BTV), expected, rtol=1e-5, atol=1e-6)


def test_jit_matches_eager():
    """jax.jit gives the eager sums."""
    logits_BTV, targets_BT = random_logits_targets(seed=9)
    def fn(logits_BTV, targets_BT):
        return label_smoothed_cross_entropy(logits_BTV, targets_BT, label_smoothing=EPS_LS)

    eager, jitted = fn(logits_BTV, targets_BT), jax.jit(fn)(logits_BTV, targets_BT)
    assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-6)


# --- accuracy -----------------------------------------------------------------


def test_accuracy_literal():
    """Argmaxes [1, 2, 0 | 2, 0, 1] against targets [1, 1, 2 | 2, 0, 0]: 2 right of 4 real."""
    logits_BTV = jnp.array([
        [[0.0, 5.0, 1.0], [0.0, 1.0, 2.0], [3.0, 1.0, 2.0]],
        [[0.0, 1.0, 9.0], [7.0, 1.0, 2.0], [0.0, 4.0, 2.0]],
    ])
    targets_BT = jnp.array([[1, 1, 2], [2, 0, 0]])
    correct, weight_sum = accuracy(logits_BTV, targets_BT)
    assert (float(correct), float(weight_sum)) == (2.0, 4.0)
    correct, weight_sum = accuracy(logits_BTV, targets_BT, jnp.ones((2, 3)))
    assert (float(correct), float(weight_sum)) == (3.0, 6.0)  # the padded (1, 1) counts now


def test_accuracy_is_numpys_argmax_ties_included_in_bfloat16():
    """NumPy's argmax count (the first of tied largest logits), over 8 × 50 tokens of V = 37
    whose bfloat16 logits tie often: values of a few levels only, as rounded logits tie."""
    rng = np.random.default_rng(4)
    logits_NV = jnp.asarray(rng.integers(0, 6, size=(8, 50, 37)) * 0.125, jnp.bfloat16)
    rounded_NV = np.asarray(logits_NV, np.float32)
    tied = np.sum(rounded_NV == rounded_NV.max(-1, keepdims=True), axis=-1) > 1
    assert tied.mean() > 0.5  # most tokens' largest logit is tied
    targets_N = rng.integers(1, 37, size=(8, 50))
    # Half the tokens' target is one of their tied largest: the first (right) or the last.
    targets_N[::2] = np.argmax(rounded_NV[::2], axis=-1)
    targets_N[1::4] = 36 - np.argmax(rounded_NV[1::4, :, ::-1], axis=-1)
    expected = np.sum(np.argmax(rounded_NV, axis=-1) == targets_N)
    correct, _ = accuracy(logits_NV, jnp.asarray(targets_N), jnp.ones((8, 50)))
    assert float(correct) == expected > 150


def test_logit_terms_against_numpy_float64():
    """The reductions the loss and accuracy share, against float64 NumPy."""
    logits_BTV, targets_BT = random_logits_targets(seed=5)
    terms = logit_terms(logits_BTV, targets_BT)
    x = np.asarray(logits_BTV, np.float64)
    expected = dict(logsumexp=np.log(np.exp(x).sum(-1)),
                    target=np.take_along_axis(x, np.asarray(targets_BT)[..., None], -1)[..., 0],
                    total=x.sum(-1))
    for name, value in expected.items():
        assert_allclose(np.asarray(getattr(terms, name)), value, rtol=1e-6, atol=1e-6,
                        err_msg=name)
    np.testing.assert_array_equal(terms.argmax, np.argmax(x, axis=-1))


# --- input checks -------------------------------------------------------------


@pytest.mark.parametrize("eps", [-0.1, 1.0, 1.5])
def test_label_smoothing_out_of_range_raises(eps):
    """ε must be in [0, 1): ε = 1 would take log 0."""
    logits_BTV, targets_BT = random_logits_targets()
    with pytest.raises(ValueError, match="label_smoothing"):
        label_smoothed_cross_entropy(logits_BTV, targets_BT, label_smoothing=eps)


def test_targets_outside_the_vocabulary_or_not_integers_raise():
    """Known targets outside [0, V) would take no logit (an id V) or the last one (-1), and
    float targets would compare with the vocabulary's ids: both a one-line error. Traced
    targets are checked for their dtype only."""
    logits_BTV, targets_BT = random_logits_targets()
    for fn in (label_smoothed_cross_entropy, accuracy):
        for bad_id, (low, high) in ((V, (0, V)), (-3, (-3, int(targets_BT.max())))):
            with pytest.raises(ValueError) as error:
                fn(logits_BTV, targets_BT.at[1, 2].set(bad_id))  # a padding target's place
            assert str(error.value) == (f"targets must be in [0, {V}) (vocab_size), got ids "
                                        f"from {low} to {high}")
        with pytest.raises(TypeError, match="^targets must be integer ids, got float32$"):
            fn(logits_BTV, targets_BT.astype(jnp.float32))
        with pytest.raises(TypeError, match="^targets must be integer ids, got float32\n"):
            jax.jit(fn)(logits_BTV, targets_BT.astype(jnp.float32))
        # optax's one-hot targets, and the arguments swapped: said, not a shape mismatch.
        with pytest.raises(TypeError, match=r"^targets must be integer ids, got float32 "
                                            r"\(one-hot targets\? pass their argmax\)$"):
            fn(logits_BTV, jax.nn.one_hot(targets_BT, V))
        with pytest.raises(TypeError, match=r"^targets must be integer ids, got float32 "
                                            r"\(logits and targets swapped\? logits \(B, T, "
                                            r"V\) first\)$"):
            fn(targets_BT, logits_BTV)
        weight = jax.jit(fn)(logits_BTV, targets_BT.at[0, 0].set(V))[1]  # not known: no check
        assert float(weight) == np.sum(np.asarray(targets_BT) != 0)


def test_shape_mismatch_raises():
    """Logits must be targets' shape + (V,), and weights targets' shape; logits without
    their V axis are named as such, not as ids outside a vocabulary of their last axis."""
    logits_BTV, targets_BT = random_logits_targets()
    for fn in (label_smoothed_cross_entropy, accuracy):
        with pytest.raises(ValueError, match="logits shape"):
            fn(logits_BTV[:, :-1], targets_BT)
        with pytest.raises(ValueError) as error:
            fn(logits_BTV[..., 0], targets_BT)
        assert str(error.value) == (f"logits shape {targets_BT.shape} must be targets shape "
                                    f"{targets_BT.shape} + (V,)")
        with pytest.raises(ValueError, match="weights shape"):
            fn(logits_BTV, targets_BT, jnp.ones((B, 1)))


def test_the_default_smoothing_is_the_papers():
    """The function named for §5.4 smoothed nothing unless told: ε_ls = 0.1 by default."""
    logits_BTV, targets_BT = jnp.array([HAND_LOGITS]), jnp.array([HAND_TARGETS])
    loss_sum, _ = label_smoothed_cross_entropy(logits_BTV, targets_BT)
    assert_allclose(float(loss_sum), hand_loss(0, 0.1) + hand_loss(1, 0.1), rtol=1e-6)
    plain, _ = label_smoothed_cross_entropy(logits_BTV, targets_BT, label_smoothing=0.0)
    assert_allclose(float(plain), hand_loss(0, 0.0) + hand_loss(1, 0.0), rtol=1e-6)
