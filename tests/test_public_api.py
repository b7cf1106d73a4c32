"""The public surface takes the ecosystem's names (STYLE.md item 6).

Every function and module is called here the way `jax.nn`'s and Flax's users call their
counterparts, with keywords (`dot_product_attention(q, k, v, mask=m)`,
`mha.apply(variables, inputs_q=x, inputs_kv=y, mask=m)`), and compared with
`jax.nn` / `flax.linen` wherever they compute the same thing. A last test keeps the
dimension key out of every public signature: it names tensors inside the code.
"""

import inspect
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax as tj
from transformer_jax import (attention, decoding, layer_norm, layers, losses, masks, model, optim,
                             positional)

# Distinct primes, so no transpose passes by accident.
B, T, S, N, H = 2, 3, 5, 7, 11
D = N * H
TINY = tj.get_model_config("tiny", vocab_size=31)


def _qkv(length_q=T, length_kv=S, seed=0):
    """query (B, T, N, H), key and value (B, S, N, H), float32."""
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=(B, length, N, H)), jnp.float32)
                 for length in (length_q, length_kv, length_kv))


def _mask_B1TS(length_q=T, length_kv=S, seed=0):
    """Padding (row 1 has 3 keys) and random holes; key 0 always visible, so no row is empty."""
    rng = np.random.default_rng(seed)
    mask_B1TS = np.arange(length_kv)[None, None, None, :] < np.array([length_kv, 3])[:, None,
                                                                                      None, None]
    mask_B1TS = mask_B1TS & (rng.random((B, 1, length_q, length_kv)) < 0.7)
    mask_B1TS[..., 0] = True
    return jnp.asarray(mask_B1TS)


def _close(actual, expected, tol=1e-5):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=tol, rtol=tol)


# --- pure functions, against jax.nn and flax.linen ----------------------------------------


@pytest.mark.parametrize("implementation", ["reference", "xla", "auto"])
def test_dot_product_attention_called_as_jax_nn(implementation):
    """`dot_product_attention(q, k, v, mask=m)` and the all-keyword call give jax.nn's output."""
    q, k, v = _qkv()
    mask = _mask_B1TS()
    expected = jax.nn.dot_product_attention(q, k, v, mask=mask)
    _close(tj.dot_product_attention(q, k, v, mask=mask, implementation=implementation),
           expected)
    _close(tj.dot_product_attention(query=q, key=k, value=v, mask=mask,
                                    implementation=implementation), expected)


def test_is_causal_called_as_jax_nn():
    """`is_causal=True` with a padding mask, as jax.nn takes both."""
    q, k, v = _qkv(length_q=S)
    padding_B11S = tj.padding_mask(key_input=jnp.array([[4, 4, 4, 4, 4], [4, 4, 4, 0, 0]]))
    _close(tj.dot_product_attention(q, k, v, mask=padding_B11S, is_causal=True),
           jax.nn.dot_product_attention(q, k, v, mask=padding_B11S, is_causal=True))


def test_dot_product_attention_called_as_flax():
    """Flax's `nn.dot_product_attention(query, key, value, mask=...)` agrees too."""
    q, k, v = _qkv(seed=1)
    mask = _mask_B1TS(seed=1)
    _close(tj.dot_product_attention(query=q, key=k, value=v, mask=mask),
           nn.dot_product_attention(query=q, key=k, value=v, mask=mask))


def test_attention_weights_called_as_flax():
    """`attention_weights(query=, key=, mask=)` is Flax's `dot_product_attention_weights`."""
    q, k, _ = _qkv(seed=2)
    mask = _mask_B1TS(seed=2)
    _close(tj.attention_weights(query=q, key=k, mask=mask),
           nn.dot_product_attention_weights(query=q, key=k, mask=mask))


def test_masks_called_as_flax():
    """The masks with keywords equal Flax's `make_attention_mask`, `make_causal_mask` and
    `combine_masks` (which return float32: compared as bool)."""
    tokens_BS = jnp.array([[7, 3, 9, 0, 0], [5, 6, 8, 2, 0]])
    segments_BT = jnp.array([[1, 1, 2], [1, 2, 0]])
    segments_BS = jnp.array([[1, 1, 1, 2, 0], [1, 2, 2, 2, 0]])

    def same(ours, flax_mask):
        assert ours.dtype == jnp.bool_
        np.testing.assert_array_equal(np.broadcast_to(ours, flax_mask.shape),
                                      np.asarray(flax_mask).astype(bool))

    every_query_BT = jnp.ones((B, T), jnp.bool_)
    same(tj.padding_mask(key_input=tokens_BS),
         nn.make_attention_mask(query_input=every_query_BT, key_input=tokens_BS > 0))
    same(tj.causal_mask(length=T), nn.make_causal_mask(x=jnp.ones((1, T), jnp.int32)))
    same(tj.segment_mask(query_input=segments_BT, key_input=segments_BS),
         nn.make_attention_mask(query_input=segments_BT, key_input=segments_BS,
                                pairwise_fn=jnp.equal))
    same(tj.segment_mask(query_input=segments_BT),
         nn.make_attention_mask(segments_BT, segments_BT, jnp.equal))
    causal_1TT = tj.causal_mask(T)
    padding_B1TT = tj.padding_mask(tokens_BS[:, :T])
    same(tj.combine_masks(causal_1TT, padding_B1TT, None),
         nn.combine_masks(causal_1TT, padding_B1TT, None, dtype=jnp.bool_))


def test_sinusoidal_encoding_keywords():
    """`sinusoidal_encoding(positions=, d_model=)`: sin on even dims, cos on odd (§3.5)."""
    positions_P = np.arange(6)
    angles_PD = positions_P[:, None] / 10000.0 ** ((np.arange(8) // 2 * 2) / 8)[None, :]
    expected_PD = np.where(np.arange(8) % 2 == 0, np.sin(angles_PD), np.cos(angles_PD))
    _close(tj.sinusoidal_encoding(positions=positions_P, d_model=8), expected_PD)


def test_registry_keywords():
    """The registry's functions by keyword; a keyword-registered implementation runs."""
    assert tj.resolve_implementation(name="auto", dtype=jnp.float32, dropout_rate=0.1) \
        == "reference"
    assert tj.choose_implementation(name="xla", dtype=jnp.float32)[0] == "xla"
    assert "reference" in tj.available_implementations(dtype=jnp.float32)
    name = "test_public_api_xla"
    tj.register_attention(name=name)(attention.xla_attention)
    try:
        assert name in tj.attention_implementations()
        q, k, v = _qkv(seed=3)
        mask = _mask_B1TS(seed=3)
        _close(tj.dot_product_attention(q, k, v, mask=mask, implementation=name),
               jax.nn.dot_product_attention(q, k, v, mask=mask))
    finally:
        del attention._IMPLEMENTATIONS[name]


def test_signatures_follow_jax_nn():
    """dot_product_attention and every registered implementation take jax.nn's (query, key,
    value, bias, mask) in its order, then its scale and is_causal by keyword."""
    theirs = inspect.signature(jax.nn.dot_product_attention).parameters
    assert list(theirs)[:5] == ["query", "key", "value", "bias", "mask"]
    for name, fn in {"dot_product_attention": tj.dot_product_attention,
                     **attention._IMPLEMENTATIONS}.items():
        ours = inspect.signature(fn).parameters
        assert list(ours)[:5] == list(theirs)[:5], name
        for keyword in ("scale", "is_causal"):
            assert ours[keyword].kind == theirs[keyword].kind == inspect.Parameter.KEYWORD_ONLY, \
                (name, keyword)


# --- modules, against Flax's --------------------------------------------------------------


def _inputs_BTD_BSD(seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32),
            jnp.asarray(rng.normal(size=(B, S, D)), jnp.float32))


def test_multi_head_attention_called_as_flax():
    """Called as Flax's MultiHeadDotProductAttention is, it gives Flax's output with the
    same variables: keys and values of two inputs (by position and by keyword), of one
    (`inputs_kv`, or `inputs_k` alone), and self-attention without either."""
    x_BTD, y_BSD = _inputs_BTD_BSD()
    z_BSD = _inputs_BTD_BSD(seed=2)[1]
    mha = tj.MultiHeadAttention(num_heads=N, d_model=D)
    variables = mha.init(jax.random.key(0), inputs_q=x_BTD, inputs_kv=y_BSD)
    flax_mha = nn.MultiHeadDotProductAttention(num_heads=N, qkv_features=D, out_features=D)
    mask_B1TS = _mask_B1TS()
    for args, kwargs in (((x_BTD, y_BSD, z_BSD), {}),
                         ((), dict(inputs_q=x_BTD, inputs_k=y_BSD, inputs_v=z_BSD))):
        _close(mha.apply(variables, *args, **kwargs, mask=mask_B1TS),
               flax_mha.apply(variables, *args, **kwargs, mask=mask_B1TS))
    theirs = flax_mha.apply(variables, inputs_q=x_BTD, inputs_k=y_BSD, inputs_v=y_BSD,
                            mask=mask_B1TS)
    _close(mha.apply(variables, inputs_q=x_BTD, inputs_kv=y_BSD, mask=mask_B1TS), theirs)
    _close(mha.apply(variables, x_BTD, y_BSD, mask=mask_B1TS), theirs)
    mask_B1TT = _mask_B1TS(length_kv=T)
    _close(mha.apply(variables, inputs_q=x_BTD, mask=mask_B1TT),
           flax_mha.apply(variables, inputs_q=x_BTD, mask=mask_B1TT))
    for kwargs, message in ((dict(inputs_kv=y_BSD, inputs_k=y_BSD), "not both"),
                            (dict(inputs_v=y_BSD), "inputs_v needs inputs_k")):
        with pytest.raises(ValueError, match=message):
            mha.apply(variables, x_BTD, **kwargs)


def test_multi_head_attention_parts_by_keyword():
    """keys_values, attend and extend by keyword give what `__call__` gives."""
    x_BTD, y_BSD = _inputs_BTD_BSD(seed=1)
    mha = tj.MultiHeadAttention(num_heads=N, d_model=D)
    variables = mha.init(jax.random.key(1), x_BTD, y_BSD)
    mask_B1TS = _mask_B1TS(seed=1)
    kv = mha.apply(variables, inputs_kv=y_BSD, method=tj.MultiHeadAttention.keys_values)
    _close(mha.apply(variables, inputs_q=x_BTD, kv=kv, mask=mask_B1TS,
                     method=tj.MultiHeadAttention.attend),
           mha.apply(variables, x_BTD, y_BSD, mask=mask_B1TS))
    empty = mha.apply(variables, batch_size=B, cache_length=T,
                      method=tj.MultiHeadAttention.empty_cache)
    causal_11TT = tj.causal_mask(T)
    out_BTD, _ = mha.apply(variables, inputs_q=x_BTD, cache=empty, position=0, mask=causal_11TT,
                           method=tj.MultiHeadAttention.extend)
    _close(out_BTD, mha.apply(variables, x_BTD, mask=causal_11TT))


def test_feed_forward_called_as_flax_dense():
    """`FeedForward(d_ff).apply(variables, inputs=x)` is Flax's Dense, relu, Dense (eq. 2)."""
    x_BTD, _ = _inputs_BTD_BSD(seed=2)
    ffn = tj.FeedForward(d_ff=13)
    variables = ffn.init(jax.random.key(2), inputs=x_BTD)
    p = variables["params"]
    h_BTF = nn.relu(nn.Dense(13).apply({"params": p["wi"]}, x_BTD))
    _close(ffn.apply(variables, inputs=x_BTD), nn.Dense(D).apply({"params": p["wo"]}, h_BTF))


def test_encoder_and_decoder_layers_by_keyword():
    """The layers take Flax's WMT example's names: (inputs, encoder_mask) and
    (targets, encoded, decoder_mask, encoder_decoder_mask)."""
    x_BTD, y_BTD = (jax.random.normal(jax.random.key(i), (B, T, TINY.d_model)) for i in (3, 4))
    memory_BSD = jax.random.normal(jax.random.key(5), (B, S, TINY.d_model))
    self_B1TT, cross_B1TS = _mask_B1TS(length_kv=T), _mask_B1TS()

    encoder_layer = tj.EncoderLayer(TINY)
    variables = encoder_layer.init(jax.random.key(6), inputs=x_BTD, encoder_mask=self_B1TT)
    _close(encoder_layer.apply(variables, inputs=x_BTD, encoder_mask=self_B1TT),
           encoder_layer.apply(variables, x_BTD, self_B1TT))

    decoder_layer = tj.DecoderLayer(TINY)
    variables = decoder_layer.init(jax.random.key(7), targets=y_BTD, encoded=memory_BSD)
    _close(decoder_layer.apply(variables, targets=y_BTD, encoded=memory_BSD,
                               decoder_mask=self_B1TT, encoder_decoder_mask=cross_B1TS),
           decoder_layer.apply(variables, y_BTD, memory_BSD, self_B1TT, cross_B1TS))


def test_embedder_and_positions_by_keyword():
    """Embedder.encode(inputs=) is Flax's nn.Embed times √D; AddPositions(inputs=,
    inputs_positions=) adds `sinusoidal_encoding` of those positions."""
    ids_BT = jnp.array([[3, 5, 0], [7, 1, 2]])
    embedder = tj.Embedder(TINY)
    variables = embedder.init(jax.random.key(8), inputs=ids_BT, method=tj.Embedder.encode)
    by_flax_BTD = nn.Embed(TINY.vocab_size, TINY.d_model).apply(
        {"params": variables["params"]["table"]}, ids_BT)
    _close(embedder.apply(variables, inputs=ids_BT, method=tj.Embedder.encode),
           by_flax_BTD * np.float32(np.sqrt(TINY.d_model)))

    x_BTD = jax.random.normal(jax.random.key(9), (B, T, TINY.d_model))
    positions_BT = jnp.array([[0, 1, 0], [2, 1, 0]])
    add = tj.AddPositions(TINY)
    variables = add.init(jax.random.key(10), inputs=x_BTD, inputs_positions=positions_BT)
    _close(add.apply(variables, inputs=x_BTD, inputs_positions=positions_BT),
           x_BTD + tj.sinusoidal_encoding(positions=positions_BT, d_model=TINY.d_model))


def test_shift_right_keywords():
    """`shift_right(x=, segment_ids=)`, Flax's `shift_inputs` names, restarts per segment."""
    shifted_BT = tj.shift_right(x=jnp.array([[5, 6, 7, 8, 9, 0]]),
                                segment_ids=jnp.array([[1, 1, 1, 2, 2, 0]]))
    np.testing.assert_array_equal(shifted_BT, [[0, 5, 6, 0, 8, 0]])


def test_transformer_by_keyword():
    """Transformer, Encoder and the decoding methods take Flax's WMT names (inputs, targets,
    encoded, ids): the keyword calls give the positional call's logits, and one cached step
    gives the full pass's first position."""
    transformer = tj.Transformer(TINY)
    inputs_BS = jnp.array([[5, 6, 7, 8, 0], [9, 4, 3, 0, 0]])
    targets_BT = jnp.array([[8, 9, 4], [3, 6, 0]])
    variables = transformer.init(jax.random.key(11), inputs=inputs_BS, targets=targets_BT)
    logits_BTV = transformer.apply(variables, inputs_BS, targets_BT)
    _close(transformer.apply(variables, inputs=inputs_BS, targets=targets_BT), logits_BTV)

    memory_BSD = transformer.apply(variables, inputs=inputs_BS, method=tj.Transformer.encode)
    _close(transformer.apply(variables, method=lambda m: m.encoder(
        inputs=inputs_BS, inputs_positions=None, inputs_segmentation=None)), memory_BSD)
    _close(transformer.apply(variables, encoded=memory_BSD, inputs=inputs_BS,
                             targets=targets_BT, method=tj.Transformer.decode), logits_BTV)

    cache = transformer.apply(variables, encoded=memory_BSD, inputs=inputs_BS, max_length=4,
                              method=tj.Transformer.init_cache)
    first_BV, _ = transformer.apply(variables, ids=jnp.zeros((B, 1), jnp.int32), cache=cache,
                                    method=tj.Transformer.decode_step)
    _close(first_BV[:, 1:], logits_BTV[:, 0, 1:], tol=1e-4)  # the padding id is never emitted


def test_searches_by_keyword():
    """greedy_search and beam_search (beam size 1 is greedy) and length_penalty by keyword."""
    vocab = 7

    def tokens_to_logits(ids_R1, cache):  # next token = previous + 2, EOS (1) after 5
        next_R = jnp.where(ids_R1[:, 0] >= 5, 1, ids_R1[:, 0] + 2)
        return jax.nn.one_hot(next_R, vocab, dtype=jnp.float32), cache

    cache = {"unused_B": jnp.zeros((B,), jnp.int32)}
    greedy_BT = tj.greedy_search(tokens_to_logits=tokens_to_logits, cache=cache, batch_size=B,
                                 max_length=5)
    np.testing.assert_array_equal(greedy_BT, [[2, 4, 6, 1, 0]] * B)
    beam_BT, _ = tj.beam_search(tokens_to_logits=tokens_to_logits, cache=cache, batch_size=B,
                                beam_size=1, max_length=5, alpha=0.6)
    np.testing.assert_array_equal(beam_BT, greedy_BT)
    assert float(tj.length_penalty(length=1, alpha=0.6)) == pytest.approx(1.0)


# --- the rule itself ----------------------------------------------------------------------

DIMENSION_SUFFIX = re.compile(r"_[BTSDFNHVKLCR1]+$")
_MODULES = (attention, masks, positional, losses, optim, layer_norm, layers, model, decoding)


def _public_callables():
    """(qualified name, callable): what `transformer_jax` exports, the public functions and
    classes of the modules behind it, and the public methods (and `__call__`) of those
    classes. NamedTuples are left out: their fields are tensors, named with the key."""
    found = {}
    exported = [getattr(tj, n) for n in dir(tj) if not n.startswith("_")]
    defined = [obj for m in _MODULES for n, obj in vars(m).items()
               if not n.startswith("_") and getattr(obj, "__module__", None) == m.__name__]
    for obj in exported + defined:
        if inspect.isfunction(obj):
            found[obj.__qualname__] = obj
        elif inspect.isclass(obj) and obj.__module__.startswith("transformer_jax"):
            if issubclass(obj, tuple):
                continue
            found[obj.__qualname__] = obj
            for name, member in vars(obj).items():
                if inspect.isfunction(member) and (name == "__call__" or not name.startswith("_")):
                    found[f"{obj.__qualname__}.{name}"] = member
    return sorted(found.items())


_PUBLIC = _public_callables()


@pytest.mark.parametrize("name, fn", _PUBLIC, ids=[name for name, _ in _PUBLIC])
def test_public_signatures_carry_no_dimension_key(name, fn):
    """A public parameter is named as its jax.nn / Flax counterpart names it (`query`, `mask`,
    `inputs_q`), never `query_BTNH`: the shapes belong in the docstring."""
    suffixed = [p for p in inspect.signature(fn).parameters if DIMENSION_SUFFIX.search(p)]
    assert not suffixed, f"{name} takes {suffixed}; name them as jax.nn / Flax do"


def test_translator_is_exported_on_first_use():
    """`tj.Translator` is translation.py's, listed by dir() (without lazy_loader's names or
    private ones), and an unknown name is still an AttributeError."""
    from transformer_jax.translation import Translator

    assert tj.Translator is Translator and "Translator" in dir(tj)
    dunders = {name for name in dir(tj) if name.startswith("_")}
    assert {"__version__", "__all__", "__getattr__"} <= dunders
    assert not {name for name in dunders if "lazy" in name or not name.startswith("__")}
    with pytest.raises(AttributeError, match="transformer_jax attribute Translatr"):
        tj.Translatr  # noqa: B018


def test_importing_the_package_imports_no_jax_until_a_name_is_used():
    """`import transformer_jax` (and the tokenizer that data workers import) loads neither
    JAX, Flax nor grain; the first use of a name imports its module; `tj.dropout` stays the
    function after a module imported `transformer_jax.dropout` itself."""
    import subprocess
    import sys

    script = """
import sys
heavy = lambda: sorted(m for m in ("jax", "flax", "grain", "optax") if m in sys.modules)
import transformer_jax as tj, transformer_jax.data.parallel_encoding, transformer_jax.data.tokenizer
print(heavy())
import transformer_jax.layers
print(heavy(), tj.dropout.__module__, type(tj.dropout).__name__)
"""
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert lines == ["[]", "['flax', 'jax'] transformer_jax.dropout function"]


def test_version_is_the_installed_distributions():
    """`tj.__version__` is the version pyproject.toml gives the installed package."""
    import pathlib
    import tomllib

    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    assert tj.__version__ == tomllib.loads(pyproject.read_text())["project"]["version"]


def test_all_lists_every_public_name():
    """`__all__` names each function and class the package exports, Translator included, and
    nothing it lacks, so `from transformer_jax import *` gives the whole public API."""
    import transformer_jax.losses  # noqa: F401  (sets tj.losses, a submodule, not the API)

    exported = {name for name in dir(tj) if not name.startswith("_")}
    assert sorted(tj.__all__) == sorted(exported) and len(set(tj.__all__)) == len(tj.__all__)
    namespace = {}
    exec("from transformer_jax import *", namespace)
    assert namespace["Translator"] is tj.Translator and namespace["dropout"] is tj.dropout
