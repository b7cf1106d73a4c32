"""The rules for the static arguments of the pure functions, one message each.

A size (a width, a count, a length) is a positive integer; a fraction (a dropout rate,
label smoothing's ε) a number in [0, 1). NumPy's and concrete JAX scalars count as their
number, since sizes are often read from a shape or an array; a bool and text do not. A
value traced by `jax.jit` has no number to check or to build the program from: it gets a
message saying to make the argument static, where Python's comparison would raise a
TracerBoolConversionError from inside the function.
"""

import numbers
import operator

import jax
import numpy as np


def positive_int(name: str, value) -> int:
    """`value` as a Python int, or a ValueError "`name` must be a positive integer, got ..."."""
    if not isinstance(value, bool) and _kind(value) in "iu":  # bool: Python's int, no size
        try:
            number = operator.index(value)  # not 2.0: a float is no size
        except jax.errors.TracerIntegerConversionError:
            raise ValueError(f"{name} must be a Python integer (under jax.jit, a static "
                             f"argument), got {value!r}") from None
        except TypeError:
            pass
        else:
            if number >= 1:
                return number
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def fraction(name: str, value) -> float:
    """`value` as a Python float in [0, 1), or a ValueError "`name` must be a number in
    [0, 1), got ..."."""
    if not isinstance(value, bool) and _kind(value) in "iuf" and np.ndim(value) == 0:
        try:
            number = float(value)
        except jax.errors.ConcretizationTypeError:
            raise ValueError(f"{name} must be a Python number in [0, 1) (under jax.jit, a "
                             f"static argument), got {value!r}") from None
        except TypeError:  # a PRNG key, ...
            pass
        else:
            if 0.0 <= number < 1.0:  # not NaN
                return number
    raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


def _kind(value) -> str:
    """NumPy's kind letter of `value`'s dtype ("b" bool, "i" int, "u" unsigned, "f" float,
    "c" complex, "U" text, ...); "i" or "f" for Python's int and float, "?" otherwise."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        try:
            return np.dtype(dtype).kind
        except TypeError:  # a PRNG key's dtype
            return "?"
    return "i" if isinstance(value, numbers.Integral) else (
        "f" if isinstance(value, numbers.Real) else "?")
