"""ModelConfig: the paper's presets (Table 3), overrides and validation."""

import dataclasses

import numpy as np
import pytest

from transformer_jax.model_config import ModelConfig, get_model_config


def test_base_preset_matches_table3():
    """"base" has the sizes of Table 3: D 512, F 2048, h 8, N 6, P_drop 0.1, d_k 64."""
    c = get_model_config("base")
    assert (c.d_model, c.d_ff, c.num_heads, c.num_layers) == (512, 2048, 8, 6)
    assert c.dropout_rate == pytest.approx(0.1)
    assert c.head_dim == 64
    assert c.positional_encoding == "sinusoidal" and c.pre_layer_norm is False


def test_big_preset_matches_table3():
    """"big" has the sizes of Table 3: D 1024, F 4096, h 16, N 6, P_drop 0.3, d_k 64."""
    c = get_model_config("big")
    assert (c.d_model, c.d_ff, c.num_heads, c.num_layers) == (1024, 4096, 16, 6)
    assert c.dropout_rate == pytest.approx(0.3)
    assert c.head_dim == 64


def test_overrides_replace_only_the_named_fields():
    """get_model_config(name, **overrides) changes the given fields and keeps the others."""
    c = get_model_config("base", vocab_size=32_000, dropout_rate=0.2)
    assert (c.vocab_size, c.dropout_rate) == (32_000, 0.2)
    assert (c.d_model, c.d_ff, c.num_heads) == (512, 2048, 8)
    assert get_model_config("base").vocab_size == 37_000  # the preset itself is untouched


def test_config_is_frozen():
    """Assigning a field of a ModelConfig raises FrozenInstanceError."""
    c = get_model_config("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 64


@pytest.mark.parametrize(
    "field, value",
    [
        ("d_model", 30),  # tiny has num_heads=4: 30 % 4 != 0
        ("d_model", 0),
        ("d_model", -8),
        ("d_ff", 0),
        ("num_heads", 0),
        ("num_layers", 0),
        ("max_length", 0),
        ("dropout_rate", -0.1),
        ("dropout_rate", 1.0),
        ("attention_dropout_rate", 1.0),
        ("attention_implementation", "flash"),
        ("positional_encoding", "rotary"),
        ("dtype", "float64"),
        ("vocab_size", 1),
        ("d_ff", 2048.0),
        ("num_layers", "6"),
        ("attention_bias", 0),
        ("pre_layer_norm", "yes"),
        ("layer_norm_epsilon", 0.0),
        ("layer_norm_epsilon", float("inf")),
        ("layer_norm_epsilon", "1e-6"),  # compared with 0, it was a TypeError naming nothing
    ],
)
def test_bad_value_raises_value_error_naming_the_field(field, value):
    """Each invalid field value raises ValueError whose message names that field."""
    with pytest.raises(ValueError, match=field):
        get_model_config("tiny", **{field: value})
    with pytest.raises(ValueError, match=field):  # the constructor validates too
        ModelConfig(**{field: value})


def test_numpy_integers_are_integers_and_a_rate_must_be_a_number():
    """Sizes from NumPy (a sweep over np.arange) are stored as Python ints; a rate given as
    text is refused by name, where comparing it raised a TypeError naming nothing."""
    config = get_model_config("tiny", d_model=np.int64(64), num_layers=np.int32(2),
                              dropout_bits=np.int64(8))
    assert (config.d_model, config.num_layers, config.dropout_bits) == (64, 2, 8)
    assert all(type(v) is int for v in (config.d_model, config.num_layers, config.dropout_bits))
    for field in ("dropout_rate", "attention_dropout_rate"):
        with pytest.raises(ValueError) as error:
            get_model_config("tiny", **{field: "0.1"})
        assert str(error.value) == f"ModelConfig.{field} must be a number in [0, 1), got '0.1'"


@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_attention_dropout_with_a_kernel_that_has_none_is_refused_at_once(implementation):
    """jax.nn's kernels have no attention dropout: the config says so when it is made, where
    it was the first training step's error, after the data was prepared. Without the
    dropout, or with "reference" or "auto" (which then picks "reference"), it is accepted."""
    with pytest.raises(ValueError) as error:
        get_model_config("tiny", attention_dropout_rate=0.1,
                         attention_implementation=implementation)
    assert str(error.value) == (
        "ModelConfig.attention_implementation must be 'reference' or 'auto' with "
        f"attention_dropout_rate=0.1 (only 'reference' implements it), got '{implementation}'")
    assert get_model_config("tiny", attention_implementation=implementation,
                            attention_dropout_rate=0.0).attention_implementation == implementation
    for name in ("reference", "auto"):
        config = get_model_config("tiny", attention_dropout_rate=0.1, attention_implementation=name)
        assert config.attention_dropout_rate == 0.1


def test_layer_norm_epsilon_is_stored_as_a_python_float():
    """A NumPy epsilon is kept as its Python float (the config is hashed by jax.jit)."""
    config = get_model_config("tiny", layer_norm_epsilon=np.float32(1e-5))
    assert type(config.layer_norm_epsilon) is float
    assert config.layer_norm_epsilon == pytest.approx(1e-5)


def test_a_dtype_as_flax_takes_it_is_stored_by_its_name():
    """jnp.bfloat16, np.float32 and np.dtype("float16"), as Flax modules' dtype= takes
    them, are stored as "bfloat16", "float32" and "float16"; float64 is refused either way."""
    import jax.numpy as jnp

    for given, name in ((jnp.bfloat16, "bfloat16"), (np.float32, "float32"),
                        (np.dtype("float16"), "float16")):
        config = ModelConfig(dtype=given)
        assert type(config.dtype) is str and config.dtype == name
        assert config.compute_dtype == jnp.dtype(name)
    for given, named in ((jnp.float64, "'float64'"), (None, "None"), ({}, "{}")):
        with pytest.raises(ValueError) as error:  # np.dtype(None) is float64: not asked
            ModelConfig(dtype=given)
        assert str(error.value) == ("ModelConfig.dtype must be one of 'float32', 'bfloat16', "
                                    f"'float16', got {named}")


def test_unknown_preset_raises():
    """An unknown preset name raises ValueError naming it."""
    with pytest.raises(ValueError, match="huge"):
        get_model_config("huge")


def test_unknown_override_field_raises():
    """An override that is not a field raises ValueError naming it."""
    with pytest.raises(ValueError, match="d_modle"):
        get_model_config("tiny", d_modle=64)


def test_the_largest_vocabulary_is_the_largest_int32_id():
    """Ids are int32: a vocabulary of 2**31 - 1 has every id in range and is accepted;
    2**31 would need the id 2**31 - 1 + 1, which int32 cannot hold, and is refused."""
    assert ModelConfig(vocab_size=2**31 - 1).vocab_size == 2**31 - 1
    with pytest.raises(ValueError) as error:
        ModelConfig(vocab_size=2**31)
    assert str(error.value) == ("ModelConfig.vocab_size must be below 2**31 (ids are int32), "
                                "got 2147483648")


def test_attention_dropout_is_checked_at_16_bits_whatever_dropout_bits_says():
    """dropout_bits sets the sublayers' bits; attention dropout draws 16 (the attention
    functions take no bits): 2**-12 is drawable in 16 bits though not in 8, and accepted
    with dropout_bits=8; 2**-18 is not, and is refused naming 16 bits."""
    config = ModelConfig(dropout_bits=8, attention_dropout_rate=2.0**-12)
    assert config.attention_dropout_rate == 2.0**-12
    with pytest.raises(ValueError, match=r"^ModelConfig\.attention_dropout_rate 3\.8\d*e-06 "
                                         r"rounds to 0 in 16 random bits"):
        ModelConfig(dropout_bits=32, attention_dropout_rate=2.0**-18)
