"""Flax layers (§3.1–§3.3) against Flax's own attention and NumPy float64 references."""

import itertools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.attention import available_implementations
from transformer_jax.layer_norm import LayerNorm
from transformer_jax.layers import Dropout, EncoderLayer, FeedForward, MultiHeadAttention, residual
from transformer_jax.model_config import get_model_config

B, T, S = 2, 3, 5


def _inputs(d_model, seed=0):
    """Query inputs (B, T, D) and key/value inputs (B, S, D), float32."""
    rng = np.random.default_rng(seed)
    q_BTD = rng.normal(size=(B, T, d_model)).astype(np.float32)
    kv_BSD = rng.normal(size=(B, S, d_model)).astype(np.float32)
    return q_BTD, kv_BSD


def _mask_B1TS(seed=0):
    """A bool mask with padding (example 1 has 3 keys) and random holes; key 0 always visible."""
    rng = np.random.default_rng(seed)
    lengths_B = np.array([S, 3])
    mask_B1TS = np.arange(S)[None, None, None, :] < lengths_B[:, None, None, None]
    mask_B1TS = mask_B1TS & (rng.random((B, 1, T, S)) < 0.7)
    mask_B1TS[..., 0] = True
    return mask_B1TS


def _params_f64(params):
    return jax.tree.map(lambda p: np.asarray(p, np.float64), params)


def np_attention_weights(q_BTNH, k_BSNH, mask_B1TS=None):
    """softmax(Q Kᵀ / √H) per head, float64, masked keys at -inf."""
    logits_BNTS = np.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH) / np.sqrt(q_BTNH.shape[-1])
    if mask_B1TS is not None:
        logits_BNTS = np.where(mask_B1TS, logits_BNTS, -np.inf)
    logits_BNTS = logits_BNTS - logits_BNTS.max(axis=-1, keepdims=True)
    e_BNTS = np.exp(logits_BNTS)
    return e_BNTS / e_BNTS.sum(axis=-1, keepdims=True)


def np_mha(p, xq_BTD, xkv_BSD, mask_B1TS=None, return_weights=False):
    """MultiHead(Q, K, V) = Concat(heads) W^O, from the module's params, in float64."""
    p = _params_f64(p)
    xq_BTD, xkv_BSD = np.float64(xq_BTD), np.float64(xkv_BSD)
    q_BTNH = np.einsum("btd,dnh->btnh", xq_BTD, p["query"]["kernel"]) + p["query"]["bias"]
    k_BSNH = np.einsum("bsd,dnh->bsnh", xkv_BSD, p["key"]["kernel"]) + p["key"]["bias"]
    v_BSNH = np.einsum("bsd,dnh->bsnh", xkv_BSD, p["value"]["kernel"]) + p["value"]["bias"]
    w_BNTS = np_attention_weights(q_BTNH, k_BSNH, mask_B1TS)
    heads_BTNH = np.einsum("bnts,bsnh->btnh", w_BNTS, v_BSNH)
    out_BTD = np.einsum("btnh,nhd->btd", heads_BTNH, p["out"]["kernel"]) + p["out"]["bias"]
    return (out_BTD, w_BNTS) if return_weights else out_BTD


def np_ffn(p, x_BTD):
    """max(0, x W1 + b1) W2 + b2 (eq. 2), float64."""
    p = _params_f64(p)
    h_BTF = np.maximum(0.0, np.float64(x_BTD) @ p["wi"]["kernel"] + p["wi"]["bias"])
    return h_BTF @ p["wo"]["kernel"] + p["wo"]["bias"]


def np_layer_norm(p, x, eps=1e-6):
    p = _params_f64(p)
    x = np.float64(x)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _init_mha(num_heads, d_model, seed=0, **kwargs):
    q_BTD, kv_BSD = _inputs(d_model, seed)
    mha = MultiHeadAttention(num_heads=num_heads, d_model=d_model, **kwargs)
    variables = mha.init(jax.random.key(seed), q_BTD, kv_BSD)
    return mha, variables, q_BTD, kv_BSD


# --- MultiHeadAttention -------------------------------------------------------------------


@pytest.mark.parametrize("num_heads, d_model", [(2, 6), (3, 15)])
@pytest.mark.parametrize("masked", [False, True])
def test_mha_matches_flax_multi_head_dot_product_attention(num_heads, d_model, masked):
    """Flax's MultiHeadDotProductAttention with our variables gives our output (1e-5)."""
    mha, variables, q_BTD, kv_BSD = _init_mha(num_heads, d_model)
    flax_mha = nn.MultiHeadDotProductAttention(
        num_heads=num_heads, qkv_features=d_model, out_features=d_model)
    flax_variables = flax_mha.init(jax.random.key(1), q_BTD, kv_BSD)
    shapes = lambda tree: jax.tree.map(lambda x: x.shape, tree)  # noqa: E731
    assert shapes(variables) == shapes(flax_variables)

    mask = jnp.asarray(_mask_B1TS()) if masked else None
    ours_BTD = mha.apply(variables, q_BTD, kv_BSD, mask=mask)
    flax_BTD = flax_mha.apply(variables, q_BTD, kv_BSD, mask=mask)
    np.testing.assert_allclose(ours_BTD, flax_BTD, atol=1e-5, rtol=1e-5)


def test_mha_without_biases_matches_flax_without_them():
    """`use_bias=False` (the paper's W^Q, W^K, W^V, W^O, §3.2.2): kernels only, and Flax's
    attention with `use_bias=False` on the same variables gives our output."""
    rng = np.random.default_rng(3)
    q_BTD, kv_BSD = (jnp.asarray(rng.normal(size=(B, n, 15)), jnp.float32) for n in (T, S))
    mha = MultiHeadAttention(num_heads=3, d_model=15, use_bias=False)
    variables = mha.init(jax.random.key(2), q_BTD, kv_BSD)
    assert {name for part in variables["params"].values() for name in part} == {"kernel"}
    flax_mha = nn.MultiHeadDotProductAttention(num_heads=3, qkv_features=15, out_features=15,
                                               use_bias=False)
    np.testing.assert_allclose(mha.apply(variables, q_BTD, kv_BSD),
                               flax_mha.apply(variables, q_BTD, kv_BSD), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_mha_matches_numpy_float64_reference(masked):
    """Projections, softmax(QKᵀ/√H)V per head, concat and W^O match NumPy float64."""
    mha, variables, q_BTD, kv_BSD = _init_mha(3, 15)
    mask_B1TS = _mask_B1TS() if masked else None
    mask = None if mask_B1TS is None else jnp.asarray(mask_B1TS)
    out_BTD = mha.apply(variables, q_BTD, kv_BSD, mask=mask)
    assert out_BTD.shape == (B, T, 15) and out_BTD.dtype == jnp.float32
    np.testing.assert_allclose(out_BTD, np_mha(variables["params"], q_BTD, kv_BSD, mask_B1TS),
                               atol=1e-5, rtol=1e-5)


def test_mha_sows_attention_weights():
    """mutable=["intermediates"] records (B,N,T,S) weights: the softmax rows, 0 where masked."""
    mha, variables, q_BTD, kv_BSD = _init_mha(3, 15)
    mask_B1TS = _mask_B1TS()
    plain_BTD = mha.apply(variables, q_BTD, kv_BSD, mask=jnp.asarray(mask_B1TS))
    out_BTD, state = mha.apply(variables, q_BTD, kv_BSD, mask=jnp.asarray(mask_B1TS),
                               mutable=["intermediates"])
    (w_BNTS,) = state["intermediates"]["attention_weights"]
    assert w_BNTS.shape == (B, 3, T, S)
    np.testing.assert_allclose(w_BNTS.sum(axis=-1), 1.0, atol=1e-6)
    hidden_BNTS = np.broadcast_to(~mask_B1TS, w_BNTS.shape)
    assert np.all(np.asarray(w_BNTS)[hidden_BNTS] == 0.0)
    _, np_w_BNTS = np_mha(variables["params"], q_BTD, kv_BSD, mask_B1TS, return_weights=True)
    np.testing.assert_allclose(w_BNTS, np_w_BNTS, atol=1e-6)
    np.testing.assert_allclose(out_BTD, plain_BTD, atol=1e-6, rtol=1e-6)


def test_mha_sown_weights_and_output_are_causal_with_is_causal():
    """Self-attention with is_causal=True and mutable=["intermediates"] (the weights sown for
    a notebook): the weights are 0 above the diagonal (§3.2.3) and the output is the one
    computed without sowing, the float64 reference's under a causal mask."""
    mha, variables, q_BTD, _ = _init_mha(3, 15)
    causal_11TT = np.tril(np.ones((T, T), bool))[None, None]
    plain_BTD = mha.apply(variables, q_BTD, is_causal=True)
    out_BTD, state = mha.apply(variables, q_BTD, is_causal=True, mutable=["intermediates"])
    (w_BNTT,) = state["intermediates"]["attention_weights"]
    assert np.all(np.asarray(w_BNTT)[np.broadcast_to(~causal_11TT, w_BNTT.shape)] == 0.0)
    expected_BTD = np_mha(variables["params"], q_BTD, q_BTD, causal_11TT)
    np.testing.assert_allclose(out_BTD, expected_BTD, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(plain_BTD, expected_BTD, atol=1e-5, rtol=1e-5)


def test_mha_attention_dropout_only_when_not_deterministic():
    """Attention dropout (dropout_rate, not the paper's) is off when deterministic (no
    "dropout" rng needed): the output is that of rate 0. With deterministic=False it differs."""
    mha, variables, q_BTD, kv_BSD = _init_mha(3, 15, dropout_rate=0.5)
    off_BTD = MultiHeadAttention(num_heads=3, d_model=15).apply(variables, q_BTD, kv_BSD)
    np.testing.assert_array_equal(mha.apply(variables, q_BTD, kv_BSD, deterministic=True),
                                  off_BTD)
    dropped_BTD = mha.apply(variables, q_BTD, kv_BSD, deterministic=False,
                            rngs={"dropout": jax.random.key(1)})
    assert np.abs(np.asarray(dropped_BTD) - np.asarray(off_BTD)).max() > 1e-3


def test_every_available_attention_implementation_gives_the_same_output():
    """Each implementation runnable here (and "auto") gives the module the same output."""
    names = available_implementations(jnp.float32)
    assert "reference" in names and "xla" in names
    _, variables, q_BTD, kv_BSD = _init_mha(3, 15)
    mask = jnp.asarray(_mask_B1TS())
    expected_BTD = np_mha(variables["params"], q_BTD, kv_BSD, _mask_B1TS())
    for name in (*names, "auto"):
        out_BTD = MultiHeadAttention(num_heads=3, d_model=15, implementation=name).apply(
            variables, q_BTD, kv_BSD, mask=mask)
        np.testing.assert_allclose(out_BTD, expected_BTD, atol=1e-5, rtol=1e-5, err_msg=name)


# --- FeedForward and residual -------------------------------------------------------------


def test_feed_forward_matches_numpy():
    """FeedForward(x) = max(0, x W1 + b1) W2 + b2 with its own params, shape (B, T, D)."""
    x_BTD, _ = _inputs(6)
    ffn = FeedForward(d_ff=10)
    variables = ffn.init(jax.random.key(0), x_BTD)
    p = variables["params"]
    assert p["wi"]["kernel"].shape == (6, 10) and p["wo"]["kernel"].shape == (10, 6)
    # Non-zero biases, so a missing bias would show.
    p = jax.tree.map(lambda a: a + 0.1 * jnp.arange(a.size, dtype=a.dtype).reshape(a.shape), p)
    out_BTD = ffn.apply({"params": p}, x_BTD)
    assert out_BTD.shape == x_BTD.shape
    np.testing.assert_allclose(out_BTD, np_ffn(p, x_BTD), atol=1e-5, rtol=1e-5)


class _Residual(nn.Module):
    """residual() around the sublayer y -> 2y."""

    pre_layer_norm: bool
    implementation: str

    @nn.compact
    def __call__(self, x):
        return residual(x, lambda y: 2.0 * y, LayerNorm(implementation=self.implementation,
                                                        name="norm"),
                        Dropout(0.5), pre_layer_norm=self.pre_layer_norm, deterministic=True)


@pytest.mark.parametrize("implementation", ["xla", "pallas"])  # tokamax: test_layer_norm.py
@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_residual_post_and_pre_layer_norm(pre_layer_norm, implementation):
    """Post-LN is LN(x + f(x)); pre-LN is x + f(LN(x)) (f(y) = 2y, dropout off), against
    NumPy in float64, with either layer norm."""
    x_BTD, _ = _inputs(8)
    x_BTD = x_BTD * 3.0 + 1.0
    module = _Residual(pre_layer_norm, implementation)
    rng = np.random.default_rng(1)
    norm = {"scale": jnp.asarray(rng.normal(size=8), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=8), jnp.float32)}
    out_BTD = module.apply({"params": {"norm": norm}}, x_BTD)
    if pre_layer_norm:
        expected_BTD = x_BTD + 2.0 * np_layer_norm(norm, x_BTD)
    else:
        expected_BTD = np_layer_norm(norm, 3.0 * x_BTD)
    np.testing.assert_allclose(out_BTD, expected_BTD, atol=1e-5, rtol=1e-5)


class _DroppedResidual(nn.Module):
    """residual() around `sublayer`, dropout 0.5 on."""

    pre_layer_norm: bool
    sublayer: Callable

    @nn.compact
    def __call__(self, x):
        return residual(x, self.sublayer, LayerNorm(name="norm"), Dropout(0.5),
                        pre_layer_norm=self.pre_layer_norm, deterministic=False)


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_residual_dropout_is_on_the_sublayers_output_alone(pre_layer_norm):
    """§5.4: dropout on each sub-layer's output before it is added to its input, never on
    the residual stream. With y -> 0 the output is LN(x) or x, as without dropout. With
    y -> 2y each element of the dropped output is 0 or 2·2y (kept, scaled by 1/(1 - 0.5)):
    pre-LN, each is x or x + 4 LN(x); post-LN, each row is LN(x ⊙ (1 + 4m)) for a mask m
    of 0s and 1s, found among all 2^8 of them (NumPy, float64). Both 0s and 1s are seen."""
    x_BTD = _inputs(8)[0] * 3.0 + 1.0
    norm = {"scale": jnp.ones(8), "bias": jnp.zeros(8)}  # LayerNorm's own initial values

    def run(sublayer):
        return np.asarray(_DroppedResidual(pre_layer_norm, sublayer).apply(
            {"params": {"norm": norm}}, x_BTD, rngs={"dropout": jax.random.key(1)}))

    x_RD = np.float64(x_BTD).reshape(-1, 8)
    zero_RD = run(lambda y: 0.0 * y).reshape(-1, 8)
    np.testing.assert_allclose(zero_RD, x_RD if pre_layer_norm else np_layer_norm(norm, x_RD),
                               atol=1e-5)
    out_RD = run(lambda y: 2.0 * y).reshape(-1, 8)
    if pre_layer_norm:
        kept_RD = np.isclose(out_RD, x_RD + 4.0 * np_layer_norm(norm, x_RD), atol=1e-4)
        assert np.all(kept_RD | np.isclose(out_RD, x_RD, atol=1e-5))
    else:
        masks_MD = np.array(list(itertools.product([0.0, 1.0], repeat=8)))
        outs_RMD = np_layer_norm(norm, x_RD[:, None] * (1.0 + 4.0 * masks_MD))
        error_RM = np.abs(outs_RMD - out_RD[:, None]).max(-1)
        assert np.all(error_RM.min(-1) < 1e-4)
        kept_RD = masks_MD[error_RM.argmin(-1)] == 1.0
    assert 0 < kept_RD.mean() < 1


# --- EncoderLayer -------------------------------------------------------------------------


def _encoder_layer(pre_layer_norm=False):
    cfg = get_model_config("tiny", pre_layer_norm=pre_layer_norm)
    x_BSD = np.random.default_rng(2).normal(size=(B, S, cfg.d_model)).astype(np.float32) * 2 + 1
    layer = EncoderLayer(cfg)
    variables = layer.init(jax.random.key(0), x_BSD)
    return cfg, layer, variables, x_BSD


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_encoder_layer_matches_numpy(pre_layer_norm):
    """EncoderLayer = two residual sublayers (self-attention, FFN), post- or pre-LN, as in NumPy."""
    cfg, layer, variables, x_BSD = _encoder_layer(pre_layer_norm)
    mask_B1SS = np.arange(S)[None, None, None, :] < np.array([S, 3])[:, None, None, None]
    out_BSD = layer.apply(variables, x_BSD, jnp.asarray(mask_B1SS))
    p = variables["params"]
    attend = lambda y: np_mha(p["self_attention"], y, y, mask_B1SS)  # noqa: E731
    ffn = lambda y: np_ffn(p["ffn"], y)  # noqa: E731
    ln1 = lambda y: np_layer_norm(p["self_attention_norm"], y)  # noqa: E731
    ln2 = lambda y: np_layer_norm(p["ffn_norm"], y)  # noqa: E731
    if pre_layer_norm:
        h = x_BSD + attend(ln1(x_BSD))
        expected_BSD = h + ffn(ln2(h))
    else:
        h = ln1(x_BSD + attend(x_BSD))
        expected_BSD = ln2(h + ffn(h))
    np.testing.assert_allclose(out_BSD, expected_BSD, atol=1e-4, rtol=1e-4)


def test_post_ln_output_is_normalised_and_pre_ln_is_not():
    """Post-LN rows have mean 0, std 1 over D (LayerNorm last, scale 1, bias 0); pre-LN rows not."""
    _, post, post_vars, x_BSD = _encoder_layer(pre_layer_norm=False)
    out_BSD = np.asarray(post.apply(post_vars, x_BSD))
    np.testing.assert_allclose(out_BSD.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out_BSD.std(-1), 1.0, atol=1e-3)

    _, pre, pre_vars, _ = _encoder_layer(pre_layer_norm=True)
    out_BSD = np.asarray(pre.apply(pre_vars, x_BSD))
    assert np.abs(out_BSD.mean(-1)).max() > 0.1 or np.abs(out_BSD.std(-1) - 1).max() > 0.1


def test_encoder_layer_dropout_only_when_not_deterministic():
    """deterministic=False with a "dropout" rng changes the output; True is repeatable, no rng."""
    _, layer, variables, x_BSD = _encoder_layer()
    first_BSD = layer.apply(variables, x_BSD, deterministic=True)
    second_BSD = layer.apply(variables, x_BSD, deterministic=True)
    np.testing.assert_array_equal(first_BSD, second_BSD)
    dropped_BSD = layer.apply(variables, x_BSD, deterministic=False,
                              rngs={"dropout": jax.random.key(3)})
    assert np.abs(np.asarray(dropped_BSD) - np.asarray(first_BSD)).max() > 1e-3


def test_mha_refuses_unbatched_inputs_and_takes_keys_of_another_width():
    """An unbatched (T, D) input was reported in per-head shapes the caller never gave. Keys
    and values of another width than the queries are projected, as in Flax's layer."""
    q_BTD, kv_BSD = _inputs(8)
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    variables = layer.init(jax.random.key(0), q_BTD, kv_BSD)
    single = "; a single sequence is x[None]"
    for args, expected in [((q_BTD[0], kv_BSD[0]), "inputs_q must be (B, T, features), got "
                                                   f"shape {q_BTD[0].shape}{single}"),
                           ((q_BTD, kv_BSD[0]), "inputs_k must be (B, S, features), got "
                                                f"shape {kv_BSD[0].shape}{single}"),
                           ((q_BTD, kv_BSD, kv_BSD[:, :2]), f"inputs_k {kv_BSD.shape} and "
                                                            f"inputs_v {kv_BSD[:, :2].shape} "
                                                            f"must have one (B, S)")]:
        with pytest.raises(ValueError) as error:
            layer.apply(variables, *args)
        assert str(error.value) == expected
    narrow = layer.init(jax.random.key(0), q_BTD, kv_BSD[..., :6])
    assert narrow["params"]["key"]["kernel"].shape == (6, 2, 4)
    assert layer.apply(narrow, q_BTD, kv_BSD[..., :6]).shape == q_BTD.shape


def test_mha_refuses_a_width_the_heads_do_not_divide():
    """d_model = 10 over 3 heads has no whole head dim: a clear error, not a shape error."""
    q_BTD, kv_BSD = _inputs(10)
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=3"):
        MultiHeadAttention(num_heads=3, d_model=10).init(jax.random.key(0), q_BTD, kv_BSD)
    with pytest.raises(ValueError) as error:  # was a ZeroDivisionError
        MultiHeadAttention(num_heads=0, d_model=10).init(jax.random.key(0), q_BTD, kv_BSD)
    assert str(error.value) == "num_heads must be a positive integer, got 0"


def test_mha_extend_writes_at_the_position_and_attends_to_the_written_slots():
    """Two steps of `extend` over a 4-slot cache: slots 0 and 1 hold the projected keys and
    values, 2 and 3 stay zero, and step 1's output is the full pass over both tokens'
    keys with a causal mask (NumPy float64)."""
    mha, variables, q_BTD, _ = _init_mha(3, 15)
    x_B2D = q_BTD[:, :2]
    cache = mha.apply(variables, B, 4, method=MultiHeadAttention.empty_cache)
    outs = []
    for t in range(2):
        mask_B11C = jnp.asarray(np.arange(4) <= t)[None, None, None, :]
        out_B1D, cache = mha.apply(variables, x_B2D[:, t:t + 1], cache, t, mask_B11C,
                                   method=MultiHeadAttention.extend)
        outs.append(out_B1D)
    kv = mha.apply(variables, x_B2D, method=MultiHeadAttention.keys_values)
    for cached_BNCH, projected_BTNH in zip(cache, kv):  # the cache is head-major
        np.testing.assert_allclose(cached_BNCH[:, :, :2], projected_BTNH.transpose(0, 2, 1, 3),
                                   atol=1e-6)
        assert np.all(np.asarray(cached_BNCH[:, :, 2:]) == 0.0)
    causal_B1TT = np.tril(np.ones((2, 2), bool))[None, None]
    full_BTD = np_mha(variables["params"], x_B2D, x_B2D, causal_B1TT)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full_BTD, atol=1e-5, rtol=1e-5)
