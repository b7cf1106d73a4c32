"""The encoder-decoder Transformer (§3, Figure 1): masks, packing, tying, counts, dtypes."""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import pytest

from transformer_jax.model import (AddPositions, DecodingCache, Transformer, count_parameters,
                                   shift_right)
from transformer_jax.model_config import get_model_config
from transformer_jax.positional import sinusoidal_encoding

TINY = get_model_config("tiny")


# Most tests use these shapes, so the jitted apply compiles once for them.
INPUTS_SHAPE, TARGETS_SHAPE = (2, 6), (2, 7)


@pytest.fixture(scope="module")
def variables():
    """Initialised tiny variables (sinusoidal, post-LN); "none" and bfloat16 share the tree."""
    return jax.jit(Transformer(TINY).init)(
        jax.random.key(0), jnp.ones(INPUTS_SHAPE, jnp.int32), jnp.ones(TARGETS_SHAPE, jnp.int32))


@pytest.fixture(scope="module")
def apply():
    """One jitted apply for the tiny config (compiles once per shape)."""
    return jax.jit(Transformer(TINY).apply, static_argnames=("deterministic",))


def _tokens(shape, seed=0):
    """Random non-padding token ids in [1, V)."""
    return jnp.asarray(np.random.default_rng(seed).integers(1, TINY.vocab_size, size=shape),
                       jnp.int32)


def _batch(seed):
    """Random (inputs_BS, targets_BT) of the common shapes, no padding."""
    return _tokens(INPUTS_SHAPE, seed), _tokens(TARGETS_SHAPE, seed + 1000)


# --- shift_right --------------------------------------------------------------------------


def test_shift_right_literal():
    """Targets move one step right with 0 in front; the last token drops off."""
    np.testing.assert_array_equal(shift_right(jnp.array([[5, 6, 7], [8, 9, 0]])),
                                  [[0, 5, 6], [0, 8, 9]])


def test_shift_right_restarts_in_each_segment():
    """With segments the shift restarts per example: none sees the previous one's last token."""
    targets_BT = jnp.array([[5, 6, 7, 8, 9, 0]])
    segments_BT = jnp.array([[1, 1, 1, 2, 2, 0]])
    np.testing.assert_array_equal(shift_right(targets_BT, segments_BT), [[0, 5, 6, 0, 8, 0]])


def test_shift_right_refuses_what_is_not_a_batch_of_targets():
    """One unbatched sequence (jnp.pad's error, before) and segment ids of another shape."""
    with pytest.raises(ValueError, match=r"^x must be \(B, T\) targets, got shape \(3,\); "
                                         r"a single sequence is x\[None\]$"):
        shift_right(jnp.array([5, 6, 7]))
    with pytest.raises(ValueError, match=r"^segment_ids must have the shape of x, \(1, 3\), "
                                         r"got \(1, 4\)$"):
        shift_right(jnp.array([[5, 6, 7]]), jnp.array([[1, 1, 2, 2]]))


# --- masks: causality, padding, packing ---------------------------------------------------


def test_decoder_is_causal(variables, apply):
    """Logits at position t depend on targets[:t] only: changing targets[t:] keeps logits[:t+1]."""
    inputs_BS, targets_BT = _batch(1)
    T = targets_BT.shape[1]
    logits_BTV = np.asarray(apply(variables, inputs_BS, targets_BT))
    assert logits_BTV.shape == (2, T, TINY.vocab_size) and logits_BTV.dtype == np.float32
    for t in range(1, T):
        changed_BT = targets_BT.at[:, t:].set(targets_BT[:, t:] % (TINY.vocab_size - 1) + 1)
        assert not np.array_equal(changed_BT, targets_BT)
        changed_BTV = np.asarray(apply(variables, inputs_BS, changed_BT))
        np.testing.assert_allclose(changed_BTV[:, : t + 1], logits_BTV[:, : t + 1], atol=1e-6)
        # The first changed target is read at position t + 1: the test can see a leak.
        if t + 1 < T:
            assert np.abs(changed_BTV[:, t + 1] - logits_BTV[:, t + 1]).max() > 1e-3


def test_padding_and_batching_do_not_change_real_positions(variables, apply):
    """An example's logits are the same alone, padded, or batched with a longer example."""
    inputs_S, targets_T = [3, 4, 5], [6, 7, 8, 9]
    alone_BTV = apply(variables, jnp.array([inputs_S]), jnp.array([targets_T]))
    padded_BTV = apply(variables, jnp.array([inputs_S + [0] * 3]), jnp.array([targets_T + [0] * 3]))
    batch_inputs_BS = jnp.array([inputs_S + [0] * 3, [11, 12, 13, 14, 15, 16]])
    batch_targets_BT = jnp.array([targets_T + [0] * 3, [21, 22, 23, 24, 25, 26, 27]])
    batched_BTV = apply(variables, batch_inputs_BS, batch_targets_BT)
    np.testing.assert_allclose(padded_BTV[:, :4], alone_BTV, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(batched_BTV[:1, :4], alone_BTV, atol=1e-5, rtol=1e-5)


def test_packed_row_equals_examples_run_alone(variables, apply):
    """Two examples packed in one row (segments, restarting positions) give unpacked logits."""
    src1, tgt1, src2, tgt2 = [3, 4, 5], [6, 7], [8, 9], [10, 11, 12]
    packed_BTV = apply(
        variables,
        jnp.array([src1 + src2 + [0]]), jnp.array([tgt1 + tgt2 + [0, 0]]),
        inputs_segmentation=jnp.array([[1, 1, 1, 2, 2, 0]]),
        targets_segmentation=jnp.array([[1, 1, 2, 2, 2, 0, 0]]),
        inputs_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
        targets_positions=jnp.array([[0, 1, 0, 1, 2, 0, 0]]),
    )
    # Each example unpacked, padded with 0 to the common shapes (padding is tested above).
    unpacked_BTV = apply(variables, jnp.array([src1 + [0] * 3, src2 + [0] * 4]),
                         jnp.array([tgt1 + [0] * 5, tgt2 + [0] * 4]))
    np.testing.assert_allclose(packed_BTV[0, 0:2], unpacked_BTV[0, :2], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(packed_BTV[0, 2:5], unpacked_BTV[1, :3], atol=1e-5, rtol=1e-5)


# --- positions ----------------------------------------------------------------------------


def test_encoder_is_permutation_equivariant_only_without_positions(variables):
    """"none": permuting the tokens permutes the encoder rows; "sinusoidal": it does not."""
    inputs_BS = _tokens(INPUTS_SHAPE, 3)
    perm_S = np.array([3, 0, 5, 1, 4, 2])
    for encoding, equivariant in (("none", True), ("sinusoidal", False)):
        model = Transformer(get_model_config("tiny", positional_encoding=encoding))
        memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
        permuted_BSD = model.apply(variables, inputs_BS[:, perm_S], method=Transformer.encode)
        diff = np.abs(np.asarray(permuted_BSD) - np.asarray(memory_BSD)[:, perm_S]).max()
        assert (diff < 1e-5) if equivariant else (diff > 1e-2), (encoding, diff)


def test_learned_positions(variables, apply):
    """"learned" adds a (max_length, D) table to encoder and decoder; filled with sinusoids it
    reproduces the sinusoidal model, and its random init gives different logits."""
    cfg = get_model_config("tiny", positional_encoding="learned")
    model = Transformer(cfg)
    inputs_BS, targets_BT = _batch(4)
    shapes = jax.eval_shape(model.init, jax.random.key(0), inputs_BS, targets_BT)["params"]
    for part in ("encoder", "decoder"):
        assert shapes[part]["positions"]["table"].shape == (cfg.max_length, cfg.d_model)

    def with_table(table_PD):
        params = flax.core.unfreeze(variables["params"])
        for part in ("encoder", "decoder"):
            params[part]["positions"] = {"table": table_PD}
        return {"params": params}

    sinusoidal_BTV = apply(variables, inputs_BS, targets_BT)
    sines_PD = sinusoidal_encoding(jnp.arange(cfg.max_length), cfg.d_model)
    np.testing.assert_allclose(model.apply(with_table(sines_PD), inputs_BS, targets_BT),
                               sinusoidal_BTV, atol=1e-5, rtol=1e-5)
    random_PD = jax.random.normal(jax.random.key(1), (cfg.max_length, cfg.d_model)) * 0.02
    learned_BTV = model.apply(with_table(random_PD), inputs_BS, targets_BT)
    assert np.abs(np.asarray(learned_BTV) - np.asarray(sinusoidal_BTV)).max() > 1e-2


def test_a_cache_longer_than_the_learned_table_is_refused():
    """A search past the learned table's rows read NaN positions inside its loop (where
    nothing can raise) and wrote a false EOS; the cache that would hold them is refused
    when it is made. One as long as the table is made, and sinusoids take any length but 0."""
    learned = Transformer(get_model_config("tiny", positional_encoding="learned",
                                           max_length=4))
    inputs_BS = jnp.array([[5, 6, 7, 0]])
    variables = learned.init(jax.random.key(0), inputs_BS, inputs_BS)
    memory_BSD = learned.apply(variables, inputs_BS, method=Transformer.encode)
    with pytest.raises(ValueError) as error:
        learned.apply(variables, memory_BSD, inputs_BS, 5, method=Transformer.init_cache)
    assert str(error.value) == ("max_length=5 exceeds the learned position table "
                                "(ModelConfig.max_length=4)")
    cache = learned.apply(variables, memory_BSD, inputs_BS, 4, method=Transformer.init_cache)
    assert cache.cache_length == 4
    sinusoidal = Transformer(get_model_config("tiny", max_length=4))
    cache = sinusoidal.apply(variables, memory_BSD, inputs_BS, 5, method=Transformer.init_cache)
    assert cache.cache_length == 5
    for length in (0, 2.0):  # a cache with no slot, or a float that the arrays' shapes refuse
        with pytest.raises(ValueError, match=f"^max_length must be a positive integer, got "
                                             f"{length}($|\n)"):
            sinusoidal.apply(variables, memory_BSD, inputs_BS, length,
                             method=Transformer.init_cache)


# --- embeddings ---------------------------------------------------------------------------


def test_one_embedding_matrix_tied_to_the_output(variables):
    """Exactly one (V, D) matrix; logits are the last decoder layer's output times its transpose."""
    params = variables["params"]
    V, D = TINY.vocab_size, TINY.d_model
    leaves = jax.tree.leaves(params)
    assert sum(p.shape == (V, D) for p in leaves) == 1
    assert sum(V in p.shape for p in leaves) == 1  # no separate output projection
    table_VD = params["embedder"]["table"]["embedding"]

    inputs_BS, targets_BT = _batch(6)
    logits_BTV, state = Transformer(TINY).apply(
        variables, inputs_BS, targets_BT, capture_intermediates=True, mutable=["intermediates"])
    (hidden_BTD,) = state["intermediates"]["decoder"][f"layer_{TINY.num_layers - 1}"]["__call__"]
    expected_BTV = np.einsum("btd,vd->btv", np.float64(hidden_BTD), np.float64(table_VD))
    np.testing.assert_allclose(logits_BTV, expected_BTV, atol=1e-4, rtol=1e-4)


def test_zero_embedding_row_gives_zero_logit(variables, apply):
    """Tied, bias-free output: zeroing embedding row v makes logit v exactly 0 everywhere."""
    v = 17
    params = flax.core.unfreeze(variables["params"])
    params["embedder"]["table"]["embedding"] = params["embedder"]["table"]["embedding"].at[v].set(0)
    inputs_BS, targets_BT = _batch(8)
    logits_BTV = np.asarray(apply({"params": params}, inputs_BS, targets_BT))
    assert np.all(logits_BTV[..., v] == 0.0)
    assert np.all(logits_BTV[..., v + 1] != 0.0)


def test_embeddings_are_scaled_by_sqrt_d_model(variables):
    """Embedder.encode(token) is its table row times √d_model (§3.4)."""
    tokens_BT = jnp.array([[1, 5, 0], [127, 2, 2]])
    embedded_BTD = Transformer(TINY).apply(variables, tokens_BT,
                                           method=lambda m, t: m.embedder.encode(t))
    table_VD = np.asarray(variables["params"]["embedder"]["table"]["embedding"])
    np.testing.assert_allclose(embedded_BTD, table_VD[np.asarray(tokens_BT)] * np.sqrt(32.0),
                               rtol=1e-6)


# --- dropout, jit, dtypes, variants -------------------------------------------------------


def test_dropout_is_on_the_sums_of_embeddings_and_positions():
    """§5.4: dropout on the sums of the embeddings and the positional encodings: each
    element of AddPositions(ones) is 0 or 2·(1 + PE) (kept, scaled by 1/(1 - 0.5)), PE from
    NumPy's sines and cosines; about half are 0."""
    config = get_model_config("tiny", dropout_rate=0.5)
    ones_BTD = jnp.ones((2, 10, config.d_model))
    out_BTD = np.asarray(AddPositions(config).apply({}, ones_BTD, deterministic=False,
                                                    rngs={"dropout": jax.random.key(3)}))
    positions_T1, i_D = np.arange(10)[:, None], np.arange(config.d_model)
    angles_TD = positions_T1 / 10000.0 ** (2 * (i_D // 2) / config.d_model)
    pe_TD = np.where(i_D % 2 == 0, np.sin(angles_TD), np.cos(angles_TD))
    dropped_BTD = out_BTD == 0
    assert np.all(dropped_BTD | np.isclose(out_BTD, 2 * (1 + pe_TD), atol=1e-5))
    assert 0.4 < dropped_BTD.mean() < 0.6


def test_embeddings_start_with_unit_variance(variables):
    """The table is drawn from N(0, d_model^-1/2 squared), so that the embeddings, ×√d_model,
    start with unit variance (tensor2tensor's choice): mean and std of its V·D draws."""
    table_VD = np.asarray(variables["params"]["embedder"]["table"]["embedding"])
    assert table_VD.size >= 4000  # a standard error of the std under 1.2 %
    assert abs(table_VD.mean()) < 3 * TINY.d_model**-0.5 / np.sqrt(table_VD.size)
    assert table_VD.std() == pytest.approx(TINY.d_model**-0.5, rel=0.05)


def test_jit_and_eager_apply_agree(variables, apply):
    """jax.jit(apply) gives the eager logits."""
    inputs_BS, targets_BT = _batch(10)
    eager_BTV = Transformer(TINY).apply(variables, inputs_BS, targets_BT)
    np.testing.assert_allclose(apply(variables, inputs_BS, targets_BT), eager_BTV,
                               atol=1e-5, rtol=1e-5)


def test_dropout_needs_deterministic_false_and_an_rng(variables, apply):
    """deterministic=False with a "dropout" rng changes the logits; without the rng it raises."""
    inputs_BS, targets_BT = _batch(12)
    clean_BTV = apply(variables, inputs_BS, targets_BT)
    np.testing.assert_array_equal(apply(variables, inputs_BS, targets_BT), clean_BTV)
    dropped_BTV = apply(variables, inputs_BS, targets_BT, deterministic=False,
                        rngs={"dropout": jax.random.key(1)})
    assert np.abs(np.asarray(dropped_BTV) - np.asarray(clean_BTV)).max() > 1e-3
    with pytest.raises(flax.errors.InvalidRngError):
        apply(variables, inputs_BS, targets_BT, deterministic=False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_compute_keeps_float32_params_and_logits(variables, apply, dtype):
    """dtype="bfloat16" or "float16", jitted: float32 params and logits, close to the float32
    model's logits (float16 on a CPU too, where its attention cannot be XLA's)."""
    model = Transformer(get_model_config("tiny", dtype=dtype))
    inputs_BS, targets_BT = _batch(14)
    shapes = jax.eval_shape(model.init, jax.random.key(0), inputs_BS, targets_BT)
    assert {p.dtype for p in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
    half_BTV = jax.jit(model.apply)(variables, inputs_BS, targets_BT)
    full_BTV = apply(variables, inputs_BS, targets_BT)
    assert half_BTV.dtype == jnp.float32
    err = np.abs(np.asarray(half_BTV) - np.asarray(full_BTV)).max()
    assert 0 < err < 0.1 * np.abs(np.asarray(full_BTV)).max()


def test_pre_layer_norm_adds_final_norms_and_runs(variables):
    """pre_layer_norm=True adds a final LayerNorm to encoder and decoder; logits are finite."""
    model = Transformer(get_model_config("tiny", pre_layer_norm=True))
    inputs_BS, targets_BT = _batch(16)
    shapes = jax.eval_shape(model.init, jax.random.key(0), inputs_BS, targets_BT)["params"]
    params = flax.core.unfreeze(variables["params"])  # the post-LN tree plus the two final norms
    for part in ("encoder", "decoder"):
        params[part]["final_norm"] = {"scale": jnp.ones(TINY.d_model),
                                      "bias": jnp.zeros(TINY.d_model)}
    same = lambda a, b: a.shape == b.shape  # noqa: E731
    assert jax.tree.all(jax.tree.map(same, params, shapes))  # raises if the trees differ
    logits_BTV = jax.jit(model.apply)({"params": params}, inputs_BS, targets_BT)
    assert logits_BTV.shape == (*TARGETS_SHAPE, TINY.vocab_size)
    assert np.isfinite(logits_BTV).all()


def test_pre_layer_norm_outputs_are_the_final_norms():
    """Pre-LN leaves the residual stream unnormalised, so the encoder's memory and the
    decoder's features are the final LayerNorm's output: with its initial scale 1 and bias
    0, every position has mean 0 and variance 1 / (1 + ε / var) over D."""
    model = Transformer(get_model_config("tiny", pre_layer_norm=True))
    inputs_BS, targets_BT = _batch(17)
    variables = jax.jit(model.init)(jax.random.key(1), inputs_BS, targets_BT)

    def outputs(m, inputs, targets):
        memory_BSD = m.encode(inputs)
        return memory_BSD, m.decoder.features(memory_BSD, inputs, targets)

    for x_XD in jax.jit(functools.partial(model.apply, method=outputs))(variables, inputs_BS,
                                                                        targets_BT):
        x_XD = np.asarray(x_XD, np.float64)
        np.testing.assert_allclose(x_XD.mean(-1), 0.0, atol=1e-5)
        np.testing.assert_allclose(x_XD.var(-1), 1.0, atol=1e-3)


# --- parameter counts ---------------------------------------------------------------------


def _formula(c):
    """Sinusoidal post-LN count: shared embedding, L encoder and L decoder layers."""
    V, D, F, L = c.vocab_size, c.d_model, c.d_ff, c.num_layers
    attention = 4 * (D * D + D)  # query, key, value, out: kernel + bias
    ffn = 2 * D * F + F + D
    norm = 2 * D
    return V * D + L * (attention + ffn + 2 * norm) + L * (2 * attention + ffn + 3 * norm)


@pytest.mark.parametrize("name, paper", [("base", 65e6), ("big", 213e6)])
def test_parameter_count_matches_paper_and_formula(name, paper):
    """count_parameters equals the hand formula and is within 5% of Table 3 (V = 37000)."""
    cfg = get_model_config(name, vocab_size=37_000)
    counts = count_parameters(cfg)
    assert counts["total"] == _formula(cfg)
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert abs(counts["total"] - paper) / paper < 0.05


def test_parameter_count_of_a_preset_name_says_what_to_pass():
    with pytest.raises(TypeError) as error:
        count_parameters("base")
    assert str(error.value) == ("count_parameters takes a ModelConfig, e.g. "
                                "get_model_config('base'), got 'base'")
    # A Flax user's first try: the variables. Their repr, every weight, made the message
    # 1,500 lines; a run config's model group printed as YAML.
    cfg = get_model_config("tiny", vocab_size=100)
    variables = Transformer(cfg).init(jax.random.key(0), jnp.ones((1, 4), int),
                                      jnp.ones((1, 4), int))
    for given, what in ((variables, "a dict"), (variables["params"], "a dict"),
                        (ml_collections.ConfigDict({"d_model": 8}), "a ConfigDict")):
        with pytest.raises(TypeError) as error:
            count_parameters(given)
        assert str(error.value) == ("count_parameters takes a ModelConfig, e.g. "
                                    f"get_model_config('base'), got {what}")


def test_parameter_count_deltas_of_variants():
    """Pre-LN adds two final norms (4D); learned positions add 2 * max_length * D; the
    paper's attention without biases drops 4D per attention, 3 attentions per layer pair."""
    D, P = TINY.d_model, TINY.max_length
    base = count_parameters(TINY)["total"]
    assert base == _formula(TINY)
    assert count_parameters(get_model_config("tiny", pre_layer_norm=True))["total"] == base + 4 * D
    learned = count_parameters(get_model_config("tiny", positional_encoding="learned"))["total"]
    assert learned == base + 2 * P * D
    unbiased = count_parameters(get_model_config("tiny", attention_bias=False))["total"]
    assert unbiased == base - TINY.num_layers * 3 * 4 * D


@pytest.mark.parametrize("name", ["base", "big"])
def test_big_presets_have_float32_params(name):
    """Every parameter of "base" and "big" is float32 (shapes only, nothing allocated)."""
    tokens_BT = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    shapes = jax.eval_shape(Transformer(get_model_config(name)).init, jax.random.key(0),
                            tokens_BT, tokens_BT)
    assert {p.dtype for p in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}


def test_sequence_longer_than_learned_table_raises():
    """Learned positions: a sequence longer than max_length is an error, not NaN logits."""
    config = get_model_config("tiny", positional_encoding="learned", max_length=4)
    tokens_BT = jnp.ones((1, 6), jnp.int32)
    with pytest.raises(ValueError, match="max_length=4"):
        Transformer(config).init(jax.random.key(0), tokens_BT, tokens_BT)


@pytest.mark.parametrize("position", [4, 50, -1])
def test_a_position_outside_the_learned_table_raises(position):
    """Learned positions given eagerly: one outside [0, max_length) is an error naming the
    table, where jnp.take gave NaN logits (4, 50) or the last row (-1)."""
    config = get_model_config("tiny", positional_encoding="learned", max_length=4)
    tokens_BT, positions_BT = jnp.ones((1, 3), jnp.int32), jnp.array([[0, 1, 2]])
    model = Transformer(config)
    variables = model.init(jax.random.key(0), tokens_BT, tokens_BT)
    assert np.isfinite(model.apply(variables, tokens_BT, tokens_BT,
                                   targets_positions=positions_BT)).all()
    bad_BT = positions_BT.at[0, 2].set(position)
    message = (f"positions must be in [0, 4) (ModelConfig.max_length, the learned table's "
               f"rows), got ids from {min(0, position)} to {max(1, position)}")
    for where in ("inputs_positions", "targets_positions"):
        with pytest.raises(ValueError) as error:
            model.apply(variables, tokens_BT, tokens_BT, **{where: bad_BT})
        assert str(error.value).splitlines()[0] == message  # then JAX's note on its frames


def test_packing_needs_both_segmentations(variables):
    """Giving only the source's segment ids would leak across examples: it raises."""
    inputs_BS, targets_BT = _batch(2)
    segments_BS = jnp.ones(INPUTS_SHAPE, jnp.int32)
    with pytest.raises(ValueError, match="both"):
        Transformer(TINY).apply(variables, inputs_BS, targets_BT,
                                inputs_segmentation=segments_BS)


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_cached_decoding_equals_the_full_decoder(pre_layer_norm):
    """Step by step from the cache, the logits equal the full decoder's on the same prefix."""
    config = get_model_config("tiny", vocab_size=50, pre_layer_norm=pre_layer_norm)
    model = Transformer(config)
    inputs_BS = jnp.array([[5, 6, 7, 8, 0], [9, 3, 0, 0, 0]])
    targets_BT = jnp.array([[11, 12, 13, 14, 1, 0], [15, 16, 1, 0, 0, 0]])
    variables = jax.jit(model.init)(jax.random.key(0), inputs_BS, targets_BT)
    full_BTV = model.apply(variables, inputs_BS, targets_BT)
    memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    cache = model.apply(variables, memory_BSD, inputs_BS, 6, method=Transformer.init_cache)
    assert isinstance(cache, DecodingCache) and len(cache.self_kv) == config.num_layers
    cross_before = jax.tree.map(np.asarray, cache.cross_kv)
    step = jax.jit(functools.partial(model.apply, method=Transformer.decode_step))
    ids_B1 = jnp.zeros((2, 1), jnp.int32)  # the decoder's start symbol
    for t in range(6):
        logits_BV, cache = step(variables, ids_B1, cache)
        real_B = np.asarray(targets_BT[:, t] != 0)  # past its end a row's logits do not matter
        assert np.all(np.asarray(logits_BV)[:, 0] == np.finfo(np.float32).min)  # never padding
        np.testing.assert_allclose(np.asarray(logits_BV)[real_B][:, 1:],
                                   np.asarray(full_BTV[:, t])[real_B][:, 1:], atol=1e-5, rtol=1e-5)
        ids_B1 = targets_BT[:, t:t + 1]
    np.testing.assert_array_equal(cache.position_R, [6, 6])
    # The encoder-decoder keys and values were computed once and never changed.
    jax.tree.map(np.testing.assert_array_equal, cross_before, cache.cross_kv)
    # Every slot of the self-attention cache holds the keys the full pass projects.
    bound = model.bind(variables)
    decoder_inputs_BTD = bound.decoder.positions(
        bound.embedder.encode(shift_right(targets_BT)))
    layer = bound.decoder.layers[0]
    if pre_layer_norm:  # the sublayer reads the normalised stream
        decoder_inputs_BTD = layer.self_attention_norm(decoder_inputs_BTD)
    keys_BTNH = layer.self_attention.keys_values(decoder_inputs_BTD).key_BSNH
    np.testing.assert_allclose(cache.self_kv[0].as_key_value().key_BSNH, keys_BTNH, atol=1e-5,
                               rtol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu",
                    reason="cuDNN attention needs an NVIDIA GPU; this backend is the CPU")
def test_cudnn_model_equals_reference_model_on_gpu():
    """A bfloat16 model with cuDNN attention (packed rows: encoder, causal and cross masks)
    gives the logits and gradients of the same model with the reference attention."""
    configs = {impl: get_model_config("tiny", dtype="bfloat16", attention_implementation=impl,
                                      dropout_rate=0.0) for impl in ("cudnn", "reference")}
    rng = np.random.default_rng(3)
    segments_BT = np.repeat([[1] * 7 + [2] * 5 + [3] * 10 + [0] * 2], 4, axis=0)
    positions_BT = np.concatenate([np.arange(7), np.arange(5), np.arange(10), [0, 0]])[None]
    tokens = jnp.asarray(rng.integers(1, TINY.vocab_size, segments_BT.shape) * (segments_BT > 0))
    kwargs = dict(inputs_segmentation=segments_BT, targets_segmentation=segments_BT,
                  inputs_positions=np.repeat(positions_BT, 4, 0),
                  targets_positions=np.repeat(positions_BT, 4, 0))
    params = Transformer(configs["reference"]).init(jax.random.key(1), tokens, tokens)

    def loss_and_grads(impl):
        def loss(p):
            logits_BTV = Transformer(configs[impl]).apply(p, tokens, tokens, **kwargs)
            return jnp.sum(jnp.where(tokens[..., None] > 0, logits_BTV, 0.0) ** 2), logits_BTV
        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (_, got), got_grads = loss_and_grads("cudnn")
    (_, ref), ref_grads = loss_and_grads("reference")
    real = np.asarray(tokens > 0)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    assert rel(np.asarray(got)[real], np.asarray(ref)[real]) <= 2e-2
    flat_got, flat_ref = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
                          for g in (got_grads, ref_grads))
    assert np.isfinite(flat_got).all() and rel(flat_got, flat_ref) <= 2e-2


# --- the loss in chunks -------------------------------------------------------------------


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_chunked_loss_is_the_loss_of_the_logits(variables, pre_layer_norm):
    """Transformer.loss (output layer and loss 3 target tokens at a time) gives the smoothed
    loss, token count and accuracy of the full pass's logits, and their gradient, on a
    packed row with padding; pre-LN reads its final norm first."""
    from transformer_jax.losses import accuracy, label_smoothed_cross_entropy

    model = Transformer(get_model_config("tiny", pre_layer_norm=pre_layer_norm))
    params = flax.core.unfreeze(variables["params"])
    if pre_layer_norm:
        for part in ("encoder", "decoder"):
            params[part]["final_norm"] = {"scale": jnp.full(TINY.d_model, 1.5),
                                          "bias": jnp.full(TINY.d_model, 0.1)}
    packing = dict(inputs_segmentation=jnp.array([[1, 1, 1, 2, 2, 0]]),
                   targets_segmentation=jnp.array([[1, 1, 2, 2, 2, 0, 0]]),
                   inputs_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
                   targets_positions=jnp.array([[0, 1, 0, 1, 2, 0, 0]]))
    inputs, targets = jnp.array([[3, 4, 5, 8, 9, 0]]), jnp.array([[6, 7, 10, 11, 12, 0, 0]])

    def whole(p):
        logits = model.apply({"params": p}, inputs, targets, **packing)
        loss, count = label_smoothed_cross_entropy(logits, targets, label_smoothing=0.1)
        return loss, (count, accuracy(logits, targets)[0])

    def chunked(p):
        loss, count, correct = model.apply({"params": p}, inputs, targets, **packing,
                                           label_smoothing=0.1, chunk_size=3,
                                           method=Transformer.loss)
        return loss, (count, correct)

    # Jitted: op by op, the two passes took 23 s on a 2-core CPU.
    (loss, (count, correct)), grads = jax.jit(jax.value_and_grad(chunked, has_aux=True))(params)
    (expected, (expected_count, expected_correct)), expected_grads = jax.jit(
        jax.value_and_grad(whole, has_aux=True))(params)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert count == expected_count == 5 and correct == expected_correct
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 grads, expected_grads)


@pytest.mark.parametrize("bad_id", [TINY.vocab_size, -1])
def test_an_eager_call_refuses_ids_outside_the_vocabulary(variables, bad_id):
    """Called eagerly, as in a notebook, an id outside [0, V) in the inputs or the targets
    is a ValueError naming V and the ids' range (jnp.take would gather a row of NaN for
    id V, and the last row for -1)."""
    inputs_BS, targets_BT = map(np.asarray, _batch(0))
    low, high = int(inputs_BS.min()), int(inputs_BS.max())
    bad_BS = inputs_BS.copy()
    bad_BS[1, 3] = bad_id
    expected = (f"token ids must be in [0, {TINY.vocab_size}) (vocab_size), got ids from "
                f"{min(low, bad_id)} to {max(high, bad_id)}")
    with pytest.raises(ValueError) as error:
        Transformer(TINY).apply(variables, bad_BS, targets_BT)
    assert str(error.value) == expected
    bad_BT = targets_BT.copy()
    bad_BT[0, 0] = bad_id
    with pytest.raises(ValueError, match=rf"^targets must be in \[0, {TINY.vocab_size}\)"):
        Transformer(TINY).apply(variables, inputs_BS, bad_BT)
    assert Transformer(TINY).apply(variables, inputs_BS, targets_BT).shape == (
        *TARGETS_SHAPE, TINY.vocab_size)


def test_floats_lists_and_unbatched_ids_are_refused_in_one_line(variables):
    """Ids that are not a (B, T) integer array are refused before any lookup: jnp.take
    would fail deep inside JAX, or a missing batch axis in a broadcast much later."""
    inputs_BS, targets_BT = map(np.asarray, _batch(0))
    model = Transformer(TINY)
    cases = [((inputs_BS.astype(np.float32), targets_BT), TypeError,
              "token ids must be integer ids, got float32"),
             ((inputs_BS.tolist(), targets_BT), TypeError,
              "token ids must be an array of integer ids, got a list (jnp.asarray makes one)"),
             ((inputs_BS[0], targets_BT), ValueError,
              f"token ids must be (B, T), got shape ({inputs_BS.shape[1]},); a single "
              f"sequence is ids[None]"),
             ((inputs_BS, targets_BT[0]), ValueError,
              f"targets must be (B, T), got shape ({targets_BT.shape[1]},); a single "
              f"sequence is ids[None]"),
             ((inputs_BS, targets_BT.astype(bool)), TypeError,
              "targets must be integer ids, got bool")]
    for args, kind, expected in cases:
        with pytest.raises(kind) as error:
            model.apply(variables, *args)
        assert str(error.value).splitlines()[0] == expected


def test_ids_with_an_axis_too_many_are_refused_in_one_line(variables):
    """(1, B, S) ids (a batch stacked once more) are not (B, T) either."""
    inputs_BS, targets_BT = map(np.asarray, _batch(0))
    for args, name, shape in (((inputs_BS[None], targets_BT), "token ids", inputs_BS.shape),
                              ((inputs_BS, targets_BT[None]), "targets", targets_BT.shape)):
        with pytest.raises(ValueError) as error:
            Transformer(TINY).apply(variables, *args)
        assert str(error.value) == (f"{name} must be (B, T), got shape {(1, *shape)}; a single "
                                    f"sequence is ids[None]")


def test_mismatched_batches_positions_and_configs_are_refused_in_one_line(variables):
    """Sources and targets of different batches, positions or segment numbers not shaped as
    their ids, and a preset's name for the config: one line each, where attention's shapes
    or broadcasting failed deep inside (or, for the name, an AttributeError)."""
    inputs_BS, targets_BT = map(np.asarray, _batch(0))
    (b, s), t = inputs_BS.shape, targets_BT.shape[1]
    model = Transformer(TINY)
    shapes = f"must be (B, S, D), (B, S) and (B, T) with D = d_model = {TINY.d_model}"
    cases = [((inputs_BS, targets_BT[:1]), {},  # named "the memory", which no caller gave
              f"inputs ({b}, {s}) and targets (1, {t}) must have the same batch size B: row b "
              f"of each is one example"),
             ((inputs_BS, targets_BT), {"inputs_positions": np.zeros((b, s - 1), np.int32)},
              f"inputs_positions must have the shape of inputs, ({b}, {s}), got ({b}, {s - 1})"),
             ((inputs_BS, targets_BT), {"inputs_segmentation": np.ones((b, s), np.int32),
                                        "targets_segmentation": np.ones((b, t + 1), np.int32)},
              f"targets_segmentation must have the shape of targets, ({b}, {t}), "
              f"got ({b}, {t + 1})")]
    for args, keywords, expected in cases:
        with pytest.raises(ValueError) as error:
            model.apply(variables, *args, **keywords)
        assert str(error.value) == expected
    # A memory of another width: Flax's parameter shapes named the cross-attention's kernel.
    encoded_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    with pytest.raises(ValueError) as error:
        model.apply(variables, encoded_BSD[..., :3], inputs_BS, targets_BT,
                    method=Transformer.decode)
    assert str(error.value) == (f"the memory ({b}, {s}, 3), inputs ({b}, {s}) and targets "
                                f"({b}, {t}) {shapes}: row b of each is one example")
    # Positions of one row serve every row, as the default 0, 1, ... does (two programs: on a
    # GPU their sines may round apart).
    np.testing.assert_allclose(
        model.apply(variables, inputs_BS, targets_BT, inputs_positions=np.arange(s)[None]),
        model.apply(variables, inputs_BS, targets_BT), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError) as error:
        Transformer("tiny").apply(variables, inputs_BS, targets_BT)
    assert str(error.value).splitlines()[0] == (  # JAX adds a note on its filtered frames
        "Transformer takes a ModelConfig, e.g. Transformer(get_model_config('tiny', "
        "vocab_size=100)), got 'tiny'")
