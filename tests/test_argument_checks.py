"""The rules for sizes and fractions given as arguments, and the callers that share them."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from transformer_jax.losses import label_smoothed_cross_entropy
from transformer_jax.model_config import ModelConfig
from transformer_jax.positional import sinusoidal_encoding
from transformer_jax.argument_checks import (checked_rate, finite_number, fraction, positive_int,
                                             shown)


@pytest.mark.parametrize("value", [np.int64(3), np.uint8(3), 3])
def test_integers_of_any_kind_are_python_ints(value):
    result = positive_int("n", value)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize("value", [0, -2, True, 2.0, "3", None, np.float32(3), np.bool_(True),
                                   jnp.array(True)])
def test_everything_else_is_refused_by_name(value):
    with pytest.raises(ValueError) as error:
        positive_int("beam_size", value)
    assert str(error.value) == f"beam_size must be a positive integer, got {value!r}"


def test_one_is_the_least_size():
    assert positive_int("num_layers", 1) == 1
    assert positive_int("n", 2**70) == 2**70  # a Python int of any size, as NumPy's cannot be


@pytest.mark.parametrize("value, got", [
    (np.array([3]), "array([3])"),  # an integer array of one dimension: no index
    ([[1], [2, 3]], "a list"),  # a ragged list: NumPy makes no array of it
    (jax.random.key(0), "a PRNGKeyArray of shape () and dtype key<fry>"),
])
def test_values_numpy_cannot_take_as_a_number_are_refused_in_one_line(value, got):
    with pytest.raises(ValueError) as error:
        positive_int("n", value)
    assert str(error.value) == f"n must be a positive integer, got {got}"
    with pytest.raises(ValueError) as error:
        fraction("rate", value)
    assert str(error.value) == f"rate must be a number in [0, 1), got {got}"


def test_a_value_is_shown_whole_up_to_8_items_and_100_characters_on_one_line():
    assert shown(list(range(8))) == "[0, 1, 2, 3, 4, 5, 6, 7]" and shown(list(range(9))) == "a list"
    assert shown(np.arange(8)) == "array([0, 1, 2, 3, 4, 5, 6, 7])"
    assert shown(np.arange(9)) == "a ndarray of shape (9,) and dtype int64"
    assert shown("x" * 98) == repr("x" * 98) and shown("x" * 99) == "a str"  # 100, 101 long
    assert shown(np.zeros((2, 3))) == "a ndarray of shape (2, 3) and dtype float64"  # 2 lines
    assert shown({"beam_size": 4}) == "{'beam_size': 4}" and shown((1, 2)) == "(1, 2)"
    assert shown({"beam_size": [4]}) == "a dict"


def test_a_big_value_is_named_by_what_it_is_not_its_repr():
    """A message shows a number, a word, a short list or a small array as its repr; a
    parameter tree, a config or a big array as its type (an array's shape and dtype too):
    their reprs made one-line errors of 1,500 lines."""
    assert shown(2.5) == "2.5" and shown("base") == "'base'" and shown([1, 2]) == "[1, 2]"
    assert shown(jnp.arange(3)) == "Array([0, 1, 2], dtype=int32)"
    assert shown(np.zeros((64, 512), np.float32)) == (
        "a ndarray of shape (64, 512) and dtype float32")
    assert shown(jnp.zeros((9,), jnp.bfloat16)) == (
        "an ArrayImpl of shape (9,) and dtype bfloat16")
    assert shown({"params": {"w": np.zeros(3)}}) == "a dict"
    assert shown("x" * 200) == "a str" and shown(list(range(20))) == "a list"
    with pytest.raises(ValueError) as error:
        positive_int("num_heads", np.ones((8, 8)))
    assert str(error.value) == ("num_heads must be a positive integer, got a ndarray of shape "
                                "(8, 8) and dtype float64")


def test_callers_name_their_argument():
    """The model config prefixes its class; the encoding takes NumPy's widths as its own."""
    with pytest.raises(ValueError) as error:
        ModelConfig(d_ff=2048.0)
    assert str(error.value) == "ModelConfig.d_ff must be a positive integer, got 2048.0"
    np.testing.assert_array_equal(sinusoidal_encoding(jnp.arange(3), np.int64(4)),
                                  sinusoidal_encoding(jnp.arange(3), 4))


# bfloat16 and float8 are ml_dtypes' types, whose NumPy kind is "V", not "f": they were refused.
@pytest.mark.parametrize("value", [0.0, 0.5, np.float32(0.25), jnp.float32(0.1), 0,
                                   jnp.bfloat16(0.25), np.array(0.5, ml_dtypes.float8_e4m3fn)])
def test_fractions_of_any_kind_are_python_floats(value):
    result = fraction("rate", value)
    assert result == float(value) and type(result) is float


@pytest.mark.parametrize("value", [1.0, -0.1, float("nan"), "0.1", True, [0.1], None,
                                   np.bool_(False), np.array("0.5"), np.complex128(0.5)])
def test_a_fraction_outside_zero_to_one_is_refused_by_name(value):
    with pytest.raises(ValueError) as error:
        fraction("label_smoothing", value)
    assert str(error.value) == f"label_smoothing must be a number in [0, 1), got {value!r}"


@pytest.mark.parametrize("value, strict, accepted", [
    (0, False, True), (0.0, True, False), (np.float32(0.5), True, True),
    (jnp.float32(2), False, True),
    (-1e-9, False, False), (float("inf"), False, False), (float("nan"), False, False),
    ("0.6", False, False), (True, False, False), (None, False, False), ([0.6], False, False)])
def test_finite_numbers_above_a_bound(value, strict, accepted):
    """A length penalty's α (>= 0) or a scale (> 0): a finite Python float, else one line."""
    if accepted:
        result = finite_number("alpha", value, strict=strict)
        assert result == float(value) and type(result) is float
        return
    with pytest.raises(ValueError) as error:
        finite_number("alpha", value, strict=strict)
    sign = ">" if strict else ">="
    assert str(error.value) == f"alpha must be a finite number {sign} 0, got {value!r}"


def test_finite_numbers_are_at_least_0_unless_told_otherwise():
    assert finite_number("alpha", 0) == 0.0  # not strict
    assert finite_number("beta", 1.0, minimum=1.0) == 1.0
    with pytest.raises(ValueError) as error:
        finite_number("beta", 0.5, minimum=1.0)
    assert str(error.value) == "beta must be a finite number >= 1, got 0.5"
    with pytest.raises(ValueError) as error:
        finite_number("beta", 1.0, minimum=1.0, strict=True)
    assert str(error.value) == "beta must be a finite number > 1, got 1.0"


def test_a_rate_random_bits_cannot_draw_is_refused_naming_the_nearest_they_can():
    """8 bits draw rates in steps of 1/256: 0.001 would drop nothing, 0.999 everything."""
    assert checked_rate("rate", 0.0, 8) == 0.0 and checked_rate("rate", 0.5, 8) == 0.5
    with pytest.raises(ValueError) as error:
        checked_rate("rate", 0.001, 8)
    assert str(error.value) == ("rate 0.001 rounds to 0 in 8 random bits (the least rate above 0 "
                                "they draw is 0.00390625)")
    with pytest.raises(ValueError) as error:
        checked_rate("rate", 0.999, 8)
    assert str(error.value) == ("rate 0.999 rounds to 1 in 8 random bits (the largest rate they "
                                "draw is 0.99609375)")


def test_traced_arguments_are_asked_to_be_static():
    """Under jax.jit a size or an ε has no value: the message says to make it static, where
    Python's comparison raised a TracerBoolConversionError naming no argument."""
    targets = jnp.ones((1, 2), jnp.int32)
    with pytest.raises(ValueError, match=r"^label_smoothing must be a Python number in \[0, 1\) "
                                         r"\(under jax.jit, a static argument\), got "):
        jax.jit(lambda eps: label_smoothed_cross_entropy(jnp.zeros((1, 2, 5)), targets,
                                                         label_smoothing=eps))(0.1)
    with pytest.raises(ValueError, match=r"^max_timescale must be a finite Python number > 0 "
                                         r"\(under jax.jit, a static argument\), got "):
        jax.jit(lambda t: sinusoidal_encoding(jnp.arange(3), 4, max_timescale=t))(1e4)
    with pytest.raises(ValueError, match=r"^d_model must be a Python integer \(under jax.jit, "
                                         r"a static argument\), got "):
        jax.jit(lambda d: sinusoidal_encoding(jnp.arange(3), d))(4)
    # A concrete JAX integer is its number.
    np.testing.assert_array_equal(sinusoidal_encoding(jnp.arange(3), jnp.int32(4)),
                                  sinusoidal_encoding(jnp.arange(3), 4))


def test_checked_numbers_are_stored_as_python_numbers():
    """The config is a static argument of jit (hashed) and goes to JSON: a NumPy or JAX rate
    is kept as a float, where a jnp.float32 made the config unhashable."""
    config = ModelConfig(dropout_rate=jnp.float32(0.25), attention_dropout_rate=np.float64(0.5))
    assert (config.dropout_rate, config.attention_dropout_rate) == (0.25, 0.5)
    assert type(config.dropout_rate) is float and type(config.attention_dropout_rate) is float
    hash(config)
