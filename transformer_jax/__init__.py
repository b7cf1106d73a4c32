"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX and Flax.

Dimension key, used in tensor names (`q_BTNH`) and einsums across the package:
  B batch · T target/query length · S source/key length · D d_model · F d_ff
  N heads · H head dim (d_k = d_v) · V vocabulary · K beam · L layers
  C decoding-cache length · R search rows (B in greedy search, B·K in beam search)
"""

from transformer_jax.provenance import package_version as _package_version

__version__ = _package_version()

# Pure functions (jax.numpy only): one per equation of the paper.
from transformer_jax.positional import sinusoidal_encoding
from transformer_jax.masks import causal_mask, combine_masks, padding_mask, segment_mask
from transformer_jax.dropout import dropout
from transformer_jax.attention import (
    attention_implementations,
    attention_weights,
    available_implementations,
    choose_implementation,
    dot_product_attention,
    register_attention,
    resolve_implementation,
)
# Training's: the §5.3 learning rate (eq. 3), the §5.4 label-smoothed loss, token accuracy.
from transformer_jax.optim import learning_rate
from transformer_jax.losses import accuracy, label_smoothed_cross_entropy

# The architecture: a frozen config with presets ("base", "big", "tiny").
from transformer_jax.model_config import ModelConfig, PRESETS, get_model_config

# Flax Linen modules that hold parameters and compose the functions above.
# §3.1's LayerNorm(x + Sublayer(x)): Flax's nn.LayerNorm, or one Pallas kernel each way.
from transformer_jax.layer_norm import LayerNorm, add_layer_norm
from transformer_jax.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    residual,
)
from transformer_jax.model import (
    AddPositions,
    Decoder,
    Embedder,
    Encoder,
    Transformer,
    count_parameters,
    shift_right,
)

# Search (never imports the model): greedy and beam search over tokens_to_logits(ids, cache).
from transformer_jax.decoding import PerExample, beam_search, greedy_search, length_penalty

# A trained run's model, parameters and tokenizer (translate, attention maps):
# `tj.Translator.from_workdir("runs/default")`. Imported on first use, since it brings
# orbax and SentencePiece, which the functions and modules above do not need.
_LAZY = {"Translator": "transformer_jax.translation"}


__all__ = [  # what `from transformer_jax import *` gives: the imports above and Translator
    "sinusoidal_encoding", "causal_mask", "combine_masks", "padding_mask",
    "segment_mask", "dropout", "attention_implementations", "attention_weights",
    "available_implementations", "choose_implementation", "dot_product_attention",
    "register_attention", "resolve_implementation", "learning_rate", "accuracy",
    "label_smoothed_cross_entropy", "ModelConfig", "PRESETS", "get_model_config",
    "LayerNorm", "add_layer_norm", "DecoderLayer", "EncoderLayer", "FeedForward",
    "MultiHeadAttention",
    "residual", "AddPositions", "Decoder", "Embedder", "Encoder", "Transformer",
    "count_parameters", "shift_right", "PerExample", "beam_search", "greedy_search",
    "length_penalty", "Translator",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'transformer_jax' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
