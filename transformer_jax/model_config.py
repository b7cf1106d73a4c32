"""The architecture as a frozen dataclass, with the paper's presets (Table 3).

No JAX or Flax here: a run config is checked, and a bad value named, before they load
(`python train.py --config.model.num_heads=5` answers in a fraction of a second).
"""

import dataclasses
import sys

import numpy as np

from transformer_jax.argument_checks import (DEFAULT_BITS, DROPOUT_BITS, checked_rate,
                                             finite_number, positive_int, shown)

POSITIONAL_ENCODINGS = ("sinusoidal", "learned", "none")
DTYPES = ("float32", "bfloat16", "float16")
# The implementations defined in attention.py and layer_norm.py, named here for the checks.
BUILT_IN_ATTENTION = ("reference", "xla", "cudnn")
NO_ATTENTION_DROPOUT = ("xla", "cudnn")  # jax.nn's kernels: only "reference" implements it
LAYER_NORM_IMPLEMENTATIONS = ("xla", "pallas", "tokamax")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes and switches of the encoder-decoder Transformer (§3, Table 3)."""

    vocab_size: int = 37_000  # V: one vocabulary shared by source and target (§3.4, §5.1)
    d_model: int = 512  # D: width of every sublayer output and embedding
    d_ff: int = 2048  # F: inner width of the feed-forward network (§3.3)
    num_heads: int = 8  # N: attention heads (h); head dim H = D / N (§3.2.2)
    num_layers: int = 6  # L: identical layers in the encoder and in the decoder
    dropout_rate: float = 0.1  # P_drop on sublayer outputs and embedding sums (§5.4)
    attention_dropout_rate: float = 0.0  # not in the paper (tensor2tensor has it)
    # Random bits per dropout decision (8, 16 or 32; dropout.py): the rate is rounded to
    # them, a deviation of at most 2^-17 at 16 bits; fewer bits, fewer threefry draws.
    dropout_bits: int = DEFAULT_BITS
    positional_encoding: str = "sinusoidal"  # "sinusoidal" (§3.5), "learned" (Table 3 E), "none"
    max_length: int = 512  # rows of the "learned" position table
    pre_layer_norm: bool = False  # deviation: norm before each sublayer, one more at the end
    # Biases on the attention projections Q, K, V and W^O: a deviation the paper's §3.2.2 does
    # not make, kept by default as Flax's and torch's attention have them; False is the paper.
    attention_bias: bool = True
    attention_implementation: str = "auto"  # see transformer_jax.attention
    # "xla" (flax's nn.LayerNorm of the residual sum), "pallas" (the add and the norm in one
    # kernel each way; d_model a power of two) or "tokamax" (its kernel, to time beside ours);
    # see transformer_jax.layer_norm.
    layer_norm_implementation: str = "xla"
    dtype: str = "float32"  # compute dtype; parameters are always float32
    layer_norm_epsilon: float = 1e-6

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "max_length",
                     "dropout_bits"):  # stored as Python ints, NumPy's included
            object.__setattr__(self, name, positive_int(f"ModelConfig.{name}", getattr(self, name)))
        _require(self.vocab_size >= 2, "vocab_size", "must be at least 2", self.vocab_size)
        _require(self.vocab_size < 2**31, "vocab_size", "must be below 2**31 (ids are int32)",
                 self.vocab_size)
        _require(
            self.d_model % self.num_heads == 0,
            "d_model",
            f"must be divisible by num_heads={self.num_heads}",
            self.d_model,
        )
        object.__setattr__(self, "layer_norm_epsilon", finite_number(
            "ModelConfig.layer_norm_epsilon", self.layer_norm_epsilon, strict=True))
        _require_choice(self.dropout_bits, "dropout_bits", DROPOUT_BITS)
        # Attention dropout takes the `dropout` function's default bits (the attention
        # implementations' signature, as jax.nn's, has no place for them).
        for name, bits in (("dropout_rate", self.dropout_bits),
                           ("attention_dropout_rate", DEFAULT_BITS)):
            object.__setattr__(self, name,  # a Python float: the config is hashed (jit)
                               checked_rate(f"ModelConfig.{name}", getattr(self, name), bits))
        for name in ("pre_layer_norm", "attention_bias"):
            _require(isinstance(getattr(self, name), bool), name, "must be True or False",
                     getattr(self, name))
        _require_choice(self.positional_encoding, "positional_encoding", POSITIONAL_ENCODINGS)
        _require_choice(self.attention_implementation, "attention_implementation",
                        _attention_choices())
        _require(not (self.attention_dropout_rate and self.attention_implementation in
                      NO_ATTENTION_DROPOUT), "attention_implementation",
                 f"must be 'reference' or 'auto' with attention_dropout_rate="
                 f"{self.attention_dropout_rate} (only 'reference' implements it)",
                 self.attention_implementation)
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        _require_choice(self.dtype, "dtype", DTYPES)
        _require_choice(self.layer_norm_implementation, "layer_norm_implementation",
                        LAYER_NORM_IMPLEMENTATIONS)
        power_of_two = not self.d_model & (self.d_model - 1)
        _require(self.layer_norm_implementation != "pallas" or power_of_two, "d_model",
                 "must be a power of two for layer_norm_implementation='pallas'", self.d_model)

    @property
    def head_dim(self) -> int:
        """H = d_k = d_v = d_model / h (§3.2.2)."""
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        import jax.numpy as jnp  # here, not above: a model's dtype, built once JAX is in use

        return jnp.dtype(self.dtype)


def _attention_choices() -> tuple[str, ...]:
    """The names attention_implementation takes: attention.py's registry where it is imported
    (a notebook's `register_attention` is), otherwise the built-in ones and "auto"."""
    attention = sys.modules.get("transformer_jax.attention")
    return (attention.attention_implementations() if attention is not None
            else (*BUILT_IN_ATTENTION, "auto"))


def _dtype_name(value):
    """A dtype given as Flax modules take it (jnp.bfloat16, np.float32, a np.dtype) by its
    name, as the config stores it; a name, or what is no dtype, as it is."""
    if not isinstance(value, np.dtype | type):  # np.dtype(None) would be float64
        return value
    try:
        return np.dtype(value).name
    except TypeError:
        return value


def _require(ok: bool, field: str, rule: str, value) -> None:
    if not ok:
        raise ValueError(f"ModelConfig.{field} {rule}, got {shown(value)}")


def _require_choice(value, field: str, choices) -> None:
    _require(value in choices, field, f"must be one of {', '.join(map(repr, choices))}", value)


PRESETS = {
    # Table 3, "base": 65M parameters in the paper.
    "base": ModelConfig(),
    # Table 3, "big": 213M parameters; P_drop 0.3 for EN-DE.
    "big": ModelConfig(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3),
    # Not in the paper: milliseconds per step on a CPU, for tests and demos.
    "tiny": ModelConfig(vocab_size=128, d_model=32, d_ff=64, num_heads=4, num_layers=2,
                        max_length=128),
}


def get_model_config(name: str, **overrides) -> ModelConfig:
    """A preset ("base", "big", "tiny") with some fields replaced.

    >>> get_model_config("base", vocab_size=32_000).d_model
    512
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"ModelConfig has no field {', '.join(unknown)}; fields: {sorted(fields)}")
    return dataclasses.replace(PRESETS[name], **overrides)
