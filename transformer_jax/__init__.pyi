# The public API: what `import transformer_jax as tj` gives, and what type checkers read.
# __init__.py imports each name from its module on first use (lazy_loader.attach_stub).

# Pure functions (jax.numpy only): one per equation of the paper.
from .positional import sinusoidal_encoding
from .masks import causal_mask, combine_masks, padding_mask, segment_mask
from .dropout import dropout
from .attention import (
    attention_implementations,
    attention_weights,
    available_implementations,
    choose_implementation,
    dot_product_attention,
    register_attention,
    resolve_implementation,
)
# Training's: the §5.3 learning rate (eq. 3) and its optax schedule, the §5.4 label-smoothed
# loss, token accuracy.
from .optim import learning_rate, learning_rate_schedule
from .losses import accuracy, label_smoothed_cross_entropy

# The architecture: a frozen config with presets ("base", "big", "tiny").
from .model_config import ModelConfig, PRESETS, get_model_config

# Flax Linen modules that hold parameters and compose the functions above.
# §3.1's LayerNorm(x + Sublayer(x)): Flax's nn.LayerNorm, or one Pallas kernel each way.
from .layer_norm import LayerNorm, add_layer_norm
from .layers import (
    DecoderLayer,
    Dropout,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    residual,
)
from .model import (
    AddPositions,
    Decoder,
    Embedder,
    Encoder,
    Transformer,
    count_parameters,
    shift_right,
)

# Search (never imports the model): greedy and beam search over tokens_to_logits(ids, cache).
from .decoding import PerExample, beam_search, greedy_search, length_penalty

# A run from Python, as train.py makes it: a config file's locked ConfigDict (a misspelt
# key is an error, not a new one) and the training loop, `tj.train(config, "runs/x")`.
from .command_line import load_config_file
from .trainer import train

# A trained run's model, parameters and tokenizer (translate, attention maps):
# `tj.Translator.from_workdir("runs/default")`.
from .translation import Translator

__version__: str
