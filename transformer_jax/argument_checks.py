"""The rules for the static arguments of the pure functions, one message each.

A size (a width, a count, a length) is a positive integer; a fraction (a dropout rate,
label smoothing's ε) a number in [0, 1), and a dropout rate one that its random bits can
draw (`checked_rate`). NumPy's and concrete JAX scalars count as their number, since
sizes are often read from a shape or an array; a bool and text do not. A value traced by
`jax.jit` has no number to check or to build the program from: it gets a message saying
to make the argument static, where Python's comparison would raise a
TracerBoolConversionError from inside the function.

No JAX here: `ModelConfig` and the run config's checks use these rules, and a command line
with a bad value answers before JAX is imported (a value can only be traced once it is).
"""

import math
import numbers
import operator
import sys

import ml_dtypes
import numpy as np

DROPOUT_BITS = (8, 16, 32)  # random bits per dropout decision (dropout.py)
DEFAULT_BITS = 16


def positive_int(name: str, value) -> int:
    """`value` as a Python int, or a ValueError "`name` must be a positive integer, got ..."."""
    if value_kind(value) in "iu":  # not a bool: Python's int, but no size
        try:
            number = operator.index(value)  # not 2.0: a float is no size
        except _jax_errors("TracerIntegerConversionError"):
            raise ValueError(f"{name} must be a Python integer (under jax.jit, a static "
                             f"argument), got {shown(value)}") from None
        except TypeError:
            pass
        else:
            if number >= 1:
                return number
    raise ValueError(f"{name} must be a positive integer, got {shown(value)}")


def fraction(name: str, value) -> float:
    """`value` as a Python float in [0, 1), or a ValueError "`name` must be a number in
    [0, 1), got ..."."""
    return _number(name, value, lambda number: 0.0 <= number < 1.0, "number", "in [0, 1)")


def finite_number(name: str, value, *, minimum: float = 0.0, strict: bool = False) -> float:
    """`value` as a finite Python float >= `minimum` (> with `strict`), or a ValueError
    "`name` must be a finite number >= `minimum`, got ..."."""
    def accepts(number: float) -> bool:
        return (number > minimum if strict else number >= minimum) and number < float("inf")

    return _number(name, value, accepts, "finite number", f"{'>' if strict else '>='} {minimum:g}")


def _number(name: str, value, accepts, kind: str, condition: str) -> float:
    """`value` as a Python float that `accepts`, or "`name` must be a `kind` `condition`,
    got ..."."""
    if value_kind(value) in "iuf" and np.ndim(value) == 0:
        try:
            number = float(value)
        except _jax_errors("ConcretizationTypeError"):
            python = kind.replace("number", "Python number")  # "a finite Python number"
            raise ValueError(f"{name} must be a {python} {condition} (under jax.jit, a "
                             f"static argument), got {shown(value)}") from None
        except TypeError:  # a PRNG key, ...
            pass
        else:
            if accepts(number):  # NaN compares false
                return number
    raise ValueError(f"{name} must be a {kind} {condition}, got {shown(value)}")


def checked_rate(name: str, rate, bits: int) -> float:
    """`rate` as a float that `bits` random bits can draw (`fraction`, and neither rounded to
    0 nor to 1), or a ValueError that starts with `name`."""
    rate = fraction(name, rate)
    threshold = round(rate * 2**bits)
    if rate > 0.0 and threshold == 0:
        raise ValueError(f"{name} {rate!r} rounds to 0 in {bits} random bits (the least rate "
                         f"above 0 they draw is {2.0 ** -bits})")
    if threshold == 2**bits:
        raise ValueError(f"{name} {rate!r} rounds to 1 in {bits} random bits (the largest "
                         f"rate they draw is {1 - 2.0 ** -bits})")
    return rate


def shown(value) -> str:
    """`value` as a one-line message shows it: its repr where that is short (a number, a
    word, a small array or list), else what it is ("a dict", "a ConfigDict", "an ArrayImpl
    of shape (512, 64) and dtype float32"): a parameter tree or a config repr'd into a
    message filled the screen, and a big array's repr copies it from the device."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    scalar = (type(None), bool, numbers.Number, str, bytes, np.generic)
    items = (list(value.items()) if type(value) is dict else value
             if type(value) in (list, tuple) else None)
    small = isinstance(value, scalar) or (items is not None and len(items) <= 8 and all(
        isinstance(part, scalar) for item in items
        for part in (item if type(value) is dict else (item,))))
    if shape is not None and dtype is not None:
        small = math.prod(shape) <= 8
    if small:
        text = repr(value)
        if len(text) <= 100 and "\n" not in text:
            return text
    what = type(value).__name__
    article = "an" if what[:1].lower() in "aeiou" else "a"
    if shape is not None and dtype is not None:
        return f"{article} {what} of shape {tuple(shape)} and dtype {dtype}"
    return f"{article} {what}"


def _jax_errors(name: str) -> tuple[type, ...]:
    """(jax.errors.`name`,) once JAX is imported; () before, when no value is traced."""
    jax = sys.modules.get("jax")
    return (getattr(jax.errors, name),) if jax is not None else ()


def _ml_dtypes_kind(dtype: np.dtype) -> str:
    """"f" for ml_dtypes' floats (bfloat16, float8_*), which NumPy calls "V" (void), as it
    does its other types; "V" for those."""
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return "V"
    return "f"


def value_kind(value) -> str:
    """NumPy's kind letter of `value`'s dtype ("b" bool, "i" int, "u" unsigned, "f" float,
    "c" complex, "U" text, "O" None, ...), read without converting an array (a traced one
    included): "b", "i" or "f" for Python's bool, int and float, NumPy's for a list, "f"
    for ml_dtypes' bfloat16 and float8 (NumPy's "V"), "?" for what NumPy cannot make an
    array of, or a PRNG key."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        try:
            dtype = np.dtype(dtype)
        except TypeError:  # a PRNG key's dtype
            return "?"
        return _ml_dtypes_kind(dtype) if dtype.kind == "V" else dtype.kind
    if isinstance(value, bool):
        return "b"
    if isinstance(value, numbers.Integral):  # any size, where NumPy's would overflow
        return "i"
    if isinstance(value, numbers.Real):
        return "f"
    try:
        return np.asarray(value).dtype.kind
    except (TypeError, ValueError):  # ragged lists, ...
        return "?"
