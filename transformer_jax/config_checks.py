"""A run config's values checked before anything is read or compiled, each error naming its key.

    check_config(config)                 # ConfigError("config.decode.beam_size must be ...")
    check_config(config, devices=False)  # all but what asks JAX's backend
    config = checked_copy(config)        # the run's own copy, checked, its paths absolute

The checks run in the order of their cost: the keys and values first, with no JAX imported
(a bad value on a command line is named in a fraction of a second); then the optimizer's
and the loss's rules (optax and JAX), then what the machine's devices can run.
"""

import copy
import dataclasses
from collections.abc import Mapping

import ml_collections

from transformer_jax.data.sources import DataError, absolute_dataset, dataset_kind
from transformer_jax.data.tokenizer import MIN_VOCAB_SIZE, MODEL_TYPES
from transformer_jax.model_config import ModelConfig
from transformer_jax.run_config import (BATCHING, SEARCH_SETTINGS, STRATEGIES, TOO_LONG,
                                        build_model_config, missing_and_unknown_keys)


class ConfigError(ValueError):
    """A run config that cannot work; raised before anything compiles."""


def checked_copy(config) -> ml_collections.ConfigDict:
    """`config` (a ConfigDict, frozen or not, or a dict of its keys) as a run keeps it: a
    copy, so the caller's is left as it was, checked (`check_config`), with a folder
    dataset's path made absolute (`absolute_dataset`) for the records the run writes."""
    if not isinstance(config, Mapping | ml_collections.ConfigDict):
        raise TypeError(f"a run's config is an ml_collections.ConfigDict (load_config_file, "
                        f"run_config.base_config()) or a dict of its keys, not "
                        f"{type(config).__name__}")
    config = ml_collections.ConfigDict(copy.deepcopy(config))
    check_config(config)
    config.data.dataset = absolute_dataset(config.data.dataset)
    return config


def check_config(config, *, devices: bool = True) -> None:
    """Fails fast, naming the key, on values that could only fail later (before data is read),
    and on a key the run would ignore (`config.num_train_step = 5` in a notebook).

    `devices=False` leaves out the attention implementation against this machine's devices:
    asking JAX's backend starts it, and a process of a run of several must join the others
    first (train.py checks the rest before it does, and all of it once joined)."""
    missing, unknown = missing_and_unknown_keys(config)
    if missing or unknown:
        raise ConfigError(f"{unknown}; the run would ignore it" if unknown else
                          f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                          f"missing; start from run_config.base_config, which has every key")
    positive = ("num_train_steps", "accumulation_steps",
                "log_every_steps", "eval_every_steps", "checkpoint_every_steps",
                "checkpoints_to_keep", "decode.bleu_examples")
    for key in positive:
        _require_int(config, key, 1, "a positive integer")
    _require_int(config, "seed", 0, "an integer >= 0")
    _require_int(config, "data.num_workers", 0, "an integer >= 0 (0: pack in this process)")
    _require_int(config, "num_eval_batches", -1, "-1 (the whole split) or an integer >= 0")
    _require_int(config, "loss_chunk_size", 0, "an integer >= 0 (0: the whole logits)")
    _require_int(config, "profile_steps", 0, "an integer >= 0 (0: off)")
    _require_int(config, "decode.bleu_every_steps", 0, "an integer >= 0 (0: off)")
    for side in ("source", "target"):  # a row holds at least one token and EOS
        _require_int(config, f"data.max_{side}_length", 2, "an integer >= 2")
    _require_int(config, "data.vocab_size", MIN_VOCAB_SIZE,
                 f"an integer >= {MIN_VOCAB_SIZE} (the tokenizer's 4 special and 256 byte "
                 f"pieces, and one per distinct character of the corpus)")
    _require_int(config, "data.tokenizer_sentences", 1, "a positive integer")
    for name in ("beam_size", "alpha", "max_extra_length"):
        _require_search_setting(config, name)
    _check_batch_size(config)
    _require_choice(config, "parallelism", STRATEGIES)
    _require_choice(config, "data.too_long", TOO_LONG)
    _require_choice(config, "data.tokenizer_type", MODEL_TYPES)
    try:
        kind, _ = dataset_kind(config.data.dataset)
    except DataError as error:
        raise ConfigError(f"config.data.dataset: {error}") from None
    if kind == "numbers":
        from transformer_jax.data.numbers import CONFIG_SIZES  # TFDS: only for this dataset

        _require_choice(config, "data.numbers_size", tuple(CONFIG_SIZES))
    try:
        model_config = build_model_config(config.model, vocab_size=config.data.vocab_size)
    except (TypeError, ValueError) as error:
        raise _naming_the_key(error, "model", _MODEL_KEYS) from None
    _check_lengths(model_config, config.data)
    _check_optim(config)
    if devices:
        _check_attention_here(model_config)


# ModelConfig's errors start with the field they reject; the run config's key for it.
_MODEL_KEYS = {f"ModelConfig.{field.name}": f"model.{field.name}"
               for field in dataclasses.fields(ModelConfig)} | {
               "ModelConfig.vocab_size": "data.vocab_size"}
# optim.py's and losses.py's errors start with the argument they reject; its key.
_OPTIM_KEYS = {"warmup_steps": "optim.warmup_steps",
               "scale (learning_rate_scale)": "optim.learning_rate_scale",
               "grad_clip_norm": "optim.grad_clip_norm",
               "label_smoothing": "optim.label_smoothing"}


def _check_optim(config) -> None:
    """The optim group, before any data is read. Adam's β1, β2 and ε are checked here; the
    schedule's and clipping's rules are make_optimizer's, label smoothing's the loss's."""
    for key in ("optim.b1", "optim.b2"):
        _require_number(config, key, lambda beta: 0 <= beta < 1, "a number in [0, 1)")
    _require_number(config, "optim.eps", lambda eps: eps > 0, "a number > 0")
    # optax's schedule and the loss's rules: JAX loads here, once the cheaper checks passed.
    from transformer_jax.losses import smoothed_target
    from transformer_jax.optim import optimizer_from_config

    try:
        optimizer_from_config(config.optim, config.model.d_model)
        smoothed_target(config.optim.label_smoothing, config.data.vocab_size)
    except (TypeError, ValueError) as error:
        raise _naming_the_key(error, "optim", _OPTIM_KEYS) from None


def _naming_the_key(error: Exception, group: str, keys: dict[str, str]) -> ConfigError:
    """A library function's error about the config's values as a ConfigError that starts
    with the key (`keys`: the name the message starts with -> the key)."""
    message = str(error)
    for name, key in keys.items():
        if message.startswith(f"{name} "):
            return ConfigError(f"config.{key}{message[len(name):]}")
    return ConfigError(f"config.{group}: {message}")


def _check_batch_size(config) -> None:
    """Rows per device, or a token budget (§5.1): exactly one sizes the batch."""
    _require_int(config, "per_device_batch_size", 0, "a positive integer (or 0 with "
                 "config.data.tokens_per_batch)")
    _require_int(config, "data.tokens_per_batch", 0, "an integer >= 0 (0: "
                 "config.per_device_batch_size rows per device)")
    _require_int(config, "data.num_buckets", 1, "a positive integer")
    _require_choice(config, "data.batching", BATCHING)
    rows, tokens = config.per_device_batch_size, config.data.tokens_per_batch
    if not rows and not tokens:
        raise ConfigError("config.per_device_batch_size must be a positive integer, got 0 "
                          "(0 only with config.data.tokens_per_batch > 0)")
    if rows and tokens:
        raise ConfigError(f"config.per_device_batch_size={rows} and config.data.tokens_per_batch"
                          f"={tokens} both size the batch: set per_device_batch_size=0 to batch "
                          f"by tokens, or tokens_per_batch=0")
    longest = max(config.data.max_source_length, config.data.max_target_length)
    if 0 < tokens < longest:
        raise ConfigError(f"config.data.tokens_per_batch={tokens} holds not one row of "
                          f"{longest} tokens (config.data.max_source_length / "
                          f"max_target_length)")
    if rows % config.accumulation_steps:
        raise ConfigError(f"config.per_device_batch_size={rows} must split into "
                          f"config.accumulation_steps={config.accumulation_steps}")


def _check_lengths(model_config, data) -> None:
    """The model against the rows it will read."""
    longest = max(data.max_source_length, data.max_target_length)
    if model_config.positional_encoding == "learned" and model_config.max_length < longest:
        raise ConfigError(f"config.model.max_length={model_config.max_length} (the learned "
                          f"position table) is shorter than the rows ({longest} tokens); raise "
                          f"it or lower config.data.max_source_length / max_target_length")


def _check_attention_here(model_config) -> None:
    """The attention implementation against this machine's devices (JAX's backend)."""
    from transformer_jax.attention import cudnn_unsupported, xla_unsupported

    implementation, dtype = model_config.attention_implementation, model_config.compute_dtype
    reason = (cudnn_unsupported(dtype, head_dim=model_config.head_dim)
              if implementation == "cudnn" else
              xla_unsupported(dtype) if implementation == "xla" else "")
    if reason:
        raise ConfigError(f"config.model.attention_implementation={implementation!r} "
                          f"{reason}; use 'auto', which falls back where it cannot run")


def _lookup(config, key: str):
    *groups, name = key.split(".")
    for group in groups:
        config = config[group]
    return config[name]


def _require_int(config, key: str, low: int, rule: str) -> None:
    value = _lookup(config, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"config.{key} must be {rule}, got {value!r}")


def _require_number(config, key: str, ok, rule: str) -> None:
    value = _lookup(config, key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not ok(value):
        raise ConfigError(f"config.{key} must be {rule}, got {value!r}")


def _require_search_setting(config, name: str) -> None:
    """config.decode.`name` within the bounds translate.py's --`name` has (SEARCH_SETTINGS)."""
    parser, value = SEARCH_SETTINGS[name], config.decode[name]
    try:
        ok = not isinstance(value, bool) and parser.parse(value) == value
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"config.decode.{name} must be {parser.syntactic_help}, got {value!r}")


def _require_choice(config, key: str, choices) -> None:
    value = _lookup(config, key)
    if value not in choices:
        raise ConfigError(f"config.{key} must be one of {', '.join(map(repr, choices))}, "
                          f"got {value!r}")
