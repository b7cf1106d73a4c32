"""Building blocks of the run configs in configs/: each group with its defaults and meanings.

A config file is Python returning a locked `ml_collections.ConfigDict`; it starts
from these groups and overrides what its setup needs, so every run accepts the
same keys on the command line (`--config.data.vocab_size=8000`).
"""

import dataclasses

import ml_collections

from transformer_jax.model_config import ModelConfig, get_model_config


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
    config.num_eval_batches = -1  # validation batches per evaluation; -1: the whole split
    config.checkpoint_every_steps = 1000
    config.checkpoints_to_keep = 5
    config.model = model
    config.data = data
    config.optim = optim if optim is not None else optim_fields()
    config.decode = decode_fields()
    return config


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


def define_search_flags():
    """translate.py's and evaluate.py's --beam_size, --alpha and --max_extra_length; left
    unset (None), they are the run's `config.decode` (`Translator.search_settings`)."""
    from absl import flags

    return (flags.DEFINE_integer("beam_size", None, "beam size; 1 is greedy search (default: "
                                 "the run's config.decode, §6.1's 4)", lower_bound=1),
            flags.DEFINE_float("alpha", None, "length penalty exponent (default: the run's, "
                               "0.6)", lower_bound=0.0),
            flags.DEFINE_integer("max_extra_length", None, "output tokens beyond the input "
                                 "length (default: the run's, 50)", lower_bound=0))


def parse_flags(argv: list[str], default_config: str | None = None) -> list[str]:
    """absl's flag parsing, with a one-line error for a bad `--config.key=value`.

    Pass as `app.run(main, flags_parser=parse_flags)`: ml_collections raises a
    KeyError (with a "did you mean") or a type error from deep in the parser.
    `default_config` is the `--config` of a command line that names none; a config
    flag defined with that default would apply the overrides while the flag is
    defined, at import, where no error can be caught.
    """
    from absl import app

    named = any(a == "--config" or a.startswith("--config=") for a in argv[1:])
    if default_config and not named:
        argv = [argv[0], f"--config={default_config}", *argv[1:]]
    try:
        return app.parse_flags_with_usage(argv)  # absl's own errors: one line and exit 1
    except _OVERRIDE_ERRORS as error:
        raise SystemExit(_bad_override(error)) from None
    except OSError as error:  # a --config.key=value applied to a config file that did not load
        raise SystemExit(_cannot_load(error)) from None


_OVERRIDE_ERRORS = (AttributeError, KeyError, TypeError, ValueError, SyntaxError)


def _bad_override(error: Exception) -> str:
    # A SyntaxError is a config file's own: its str() names the file and the line.
    message = str(error)
    if len(message) > 1 and message[0] == message[-1] and message[0] in "'\"":
        message = message[1:-1]  # a KeyError's str() is its repr, in quotes
    message = message.replace("\\n", " ").replace("\\'", "'")
    return f"error in the command line: {message}"


def loaded_config(config):
    """The ConfigDict that `--config` loaded, or a one-line SystemExit when its file did not
    load or an override does not apply (ml_collections defers both, for a --config left at
    its default, to the config's first use, as a traceback)."""
    try:
        config.keys()
    except OSError as error:
        raise SystemExit(_cannot_load(error)) from None
    except _OVERRIDE_ERRORS as error:
        raise SystemExit(_bad_override(error)) from None
    return config


def _cannot_load(error: OSError) -> str:
    return f"error: cannot load --config: {str(error).strip().splitlines()[-1].strip()}"
