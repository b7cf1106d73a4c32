"""Building blocks of the run configs in configs/: each group with its defaults and meanings.

A config file is Python returning a locked `ml_collections.ConfigDict`; it starts
from these groups and overrides what its setup needs, so every run accepts the
same keys on the command line (`--config.data.vocab_size=8000`).
command_line.py loads one for `--config`. No JAX here (nor in model_config.py): a config
is loaded and checked before the run imports it.
"""

import dataclasses
import difflib
import math

import ml_collections
from absl.flags import FloatParser, IntegerParser

from transformer_jax.model_config import ModelConfig, get_model_config

# The values of the fields that choose what the input and the steps do (pipeline.py, parallel.py).
TOO_LONG = ("truncate", "drop")  # data.too_long
BATCHING = ("packed", "bucketed")  # data.batching: pipeline.py's packing, or bucketing.py
STRATEGIES = ("pmap", "sharded")  # parallelism


def model_fields(preset: str, **overrides) -> ml_collections.ConfigDict:
    """Every field of `ModelConfig` (see there), from a preset, except vocab_size.

    vocab_size is the trained tokenizer's size (`config.data.vocab_size` asks for it).
    """
    fields = dataclasses.asdict(get_model_config(preset, **overrides))
    del fields["vocab_size"]
    return ml_collections.ConfigDict(fields)


def build_model_config(model_group, vocab_size: int) -> ModelConfig:
    """The frozen `ModelConfig` of a run: its model group plus the tokenizer's size."""
    return ModelConfig(**model_group.to_dict(), vocab_size=vocab_size)


def data_fields(**overrides) -> ml_collections.ConfigDict:
    """The data group: where pairs come from, the tokenizer, and the rows they are packed in."""
    data = ml_collections.ConfigDict()
    data.dataset = "numbers"  # "numbers", "tfds:NAME" or "folder:PATH"
    data.numbers_size = "full"  # "numbers" only: "full" (200k/2k/2k pairs) or "small" (4k/200/200)
    data.source_lang = "de"
    data.target_lang = "en"
    data.data_dir = ml_collections.config_dict.placeholder(str)  # TFDS data dir; None: its default
    data.download = True  # may TFDS download and prepare a dataset that is not prepared
    data.vocab_size = 512  # shared source/target SentencePiece vocabulary (§5.1)
    data.tokenizer_type = "bpe"  # "bpe" as in the paper, or "unigram"
    data.tokenizer_sentences = 1_000_000  # at most this many sentences train the tokenizer
    data.max_source_length = 32  # tokens per packed row, EOS included
    data.max_target_length = 32
    data.too_long = "truncate"  # pairs longer than a row: "truncate" or "drop"
    # "packed": pairs share rows of the lengths above; "bucketed": pairs of similar length,
    # padded to their bucket's length (§5.1's way, at most num_buckets shapes to compile).
    data.batching = "packed"
    # Tokens per update on each side (§5.1: about 25,000), over all devices and processes,
    # in place of config.per_device_batch_size (set that to 0); 0: per_device_batch_size.
    data.tokens_per_batch = 0
    data.num_buckets = 8  # "bucketed" only: at most this many lengths, chosen to pad least
    data.num_workers = 0  # grain worker processes that pack batches; 0: in the training process
    data.lock().update(overrides)  # locked: a misspelt key is an error, not a new field
    return data.unlock()


def optim_fields(**overrides) -> ml_collections.ConfigDict:
    """The optimizer group: the paper's Adam and learning-rate schedule (§5.3, §5.4)."""
    optim = ml_collections.ConfigDict()
    optim.warmup_steps = 4000  # linear warmup, then decay with the inverse square root of the step
    optim.learning_rate_scale = 1.0  # multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    optim.b1 = 0.9  # Adam β1
    optim.b2 = 0.98  # Adam β2
    optim.eps = 1e-9  # Adam ε
    optim.label_smoothing = 0.1  # ε_ls
    optim.grad_clip_norm = 0.0  # clip the global gradient norm; 0: off (the paper does not clip)
    optim.lock().update(overrides)
    return optim.unlock()


def base_config(*, model: ml_collections.ConfigDict, data: ml_collections.ConfigDict,
                optim: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
    """A whole run: the training loop's fields around the model, data and optim groups."""
    config = ml_collections.ConfigDict()
    config.seed = 0  # fixes initialisation, data order and dropout
    config.num_train_steps = 100_000  # optimizer updates
    config.per_device_batch_size = 64  # rows per device per update; 0: data.tokens_per_batch
    config.accumulation_steps = 1  # micro-batches per update (split the rows, sum the gradients)
    # Target tokens per chunk of the output layer and loss (output_loss.py): no (B, T, V)
    # logits in memory; 0: the whole logits at once. Same loss and gradients either way.
    config.loss_chunk_size = 0
    # Trace this many steps, after the run's first 10, with JAX's profiler into
    # WORKDIR/plugins/profile/ (TensorBoard's profile tab), and print where the time went; 0: off.
    config.profile_steps = 0
    config.parallelism = "pmap"  # "pmap" or "sharded" (jit on a device mesh)
    config.log_every_steps = 100  # metrics to metrics.jsonl, TensorBoard and the progress bar
    config.eval_every_steps = 1000  # loss and accuracy on the validation split
    # Validation batches per evaluation (-1: the whole split), each of the update's rows: the
    # pairs a number of them holds changes with the rows per device and the devices.
    config.num_eval_batches = -1
    config.checkpoint_every_steps = 1000
    config.checkpoints_to_keep = 5
    config.model = model
    config.data = data
    config.optim = optim if optim is not None else optim_fields()
    config.decode = decode_fields()
    return config


class _FiniteFloatParser(FloatParser):
    """absl's FloatParser, refusing nan and inf too ("nan is not a non-negative number"):
    nan passes its bounds, as every comparison with nan is False."""

    def is_outside_bounds(self, val: float) -> bool:
        return not math.isfinite(val) or super().is_outside_bounds(val)


# The values each search setting may take, and the words a bad one is refused in: they parse
# the flags of translate.py and evaluate.py (`command_line.define_setting_flag`) and
# Translator's arguments (`check_setting`), so Python refuses what the command line refuses.
SEARCH_SETTINGS = {"beam_size": IntegerParser(lower_bound=1),
                   "alpha": _FiniteFloatParser(lower_bound=0.0),
                   "max_extra_length": IntegerParser(lower_bound=0),
                   "batch_size": IntegerParser(lower_bound=1),
                   "max_input_length": IntegerParser(lower_bound=1)}


def decode_fields(**overrides) -> ml_collections.ConfigDict:
    """The decode group: beam search of §6.1, and BLEU on validation during training."""
    decode = ml_collections.ConfigDict()
    decode.beam_size = 4
    decode.alpha = 0.6  # length penalty ((5 + |Y|) / 6)^alpha
    decode.max_extra_length = 50  # outputs up to the input length + this many tokens
    decode.bleu_every_steps = 0  # BLEU of a fixed validation subset while training; 0: off
    decode.bleu_examples = 256  # the first this many validation pairs
    decode.lock().update(overrides)
    return decode.unlock()


def every_key() -> ml_collections.ConfigDict:
    """`base_config` of the base model and the default data: every key a config file holds,
    each of the type a run reads. A reference to read, not a run's config."""
    return base_config(model=model_fields("base"), data=data_fields())


def missing_and_unknown_keys(config) -> tuple[list[str], str | None]:
    """The keys of `base_config` that `config` lacks ("config.optim.b1", ...), and the first
    key it has that `base_config` lacks, as "config.num_train_step is not a setting (did
    you mean config.num_train_steps?)" (None: none): a run would ignore such a key."""
    base = every_key()
    unknown = _missing_keys(base, config)
    if not unknown:
        return _missing_keys(config, base), None
    group, _, name = unknown[0].rpartition(".")
    known = base if group == "config" else base[group.removeprefix("config.")]
    close = difflib.get_close_matches(name, list(known.keys()), n=1)
    hint = f" (did you mean {group}.{close[0]}?)" if close else ""
    return _missing_keys(config, base), f"{unknown[0]} is not a setting{hint}"


def _missing_keys(config, reference, prefix: str = "config") -> list[str]:
    """The keys of `reference` (nested groups too) that `config` lacks, e.g. "config.optim.b1"."""
    missing = []
    for key, value in reference.items():
        if key not in config:
            missing.append(f"{prefix}.{key}")
        elif isinstance(value, ml_collections.ConfigDict) and isinstance(
                config[key], ml_collections.ConfigDict):
            missing += _missing_keys(config[key], value, f"{prefix}.{key}")
    return missing
