"""The run's tokenizer: trained once on the training split, then reused from the workdir.

    WORKDIR/tokenizer.model        the SentencePiece model (`Tokenizer.load` reads it)
    WORKDIR/tokenizer.model.json   the config.data settings it was trained with

Training, resuming, translating and evaluating share one vocabulary this way:
only the first `get_tokenizer` call trains. Every config.data setting that
changes the vocabulary (`vocabulary_settings`) is recorded, and a later call
with another value is refused with a DataError naming the setting: the run's
checkpoints only make sense with the vocabulary they were trained with. An
older settings file (version 1: vocab_size and tokenizer_type only), or none
(a model copied alone: only its size is known), is checked as far as it goes,
and a warning names the settings left unchecked.
"""

import itertools
import json
import os
import uuid
import warnings

from transformer_jax.data.sources import DataError, load_split
from transformer_jax.data.tokenizer import Tokenizer, train_tokenizer

TOKENIZER_FILE = "tokenizer.model"
# 2 records every key of VOCABULARY_SETTINGS; 1 recorded vocab_size and model_type only.
SETTINGS_VERSION = 2
# The config.data keys the vocabulary depends on: which sentences train it (the
# dataset, numbers_size for "numbers" only, the languages, in order, and how many
# sentences) and how they are cut into pieces. Not data_dir or download: where the
# data lives, and whether it may be fetched, do not change it.
VOCABULARY_SETTINGS = ("dataset", "numbers_size", "source_lang", "target_lang",
                       "tokenizer_sentences", "vocab_size", "tokenizer_type")


def tokenizer_path(workdir: str) -> str:
    """Where a run's tokenizer model is saved."""
    return os.path.join(workdir, TOKENIZER_FILE)


def settings_path(model_path: str | os.PathLike) -> str:
    """Where the settings of the model at `model_path` are recorded."""
    return os.fspath(model_path) + ".json"


def vocabulary_settings(data_config) -> dict:
    """The values of `data_config` that the vocabulary depends on, by key."""
    keys = [key for key in VOCABULARY_SETTINGS
            if key != "numbers_size" or data_config.dataset == "numbers"]
    return {key: data_config[key] for key in keys}


def training_sentences(pairs, max_sentences: int):
    """Up to `max_sentences` sentences, both sides, from pairs spread evenly over `pairs`.

    A fixed stride rather than a random sample, so the same split gives the
    same sentences, and the same model, in every process.
    """
    step = max(1, (2 * len(pairs)) // max(max_sentences, 1))
    sides = ((pair["source"], pair["target"]) for pair in pairs[::step])
    return itertools.islice(itertools.chain.from_iterable(sides), max_sentences)


def get_tokenizer(data_config, workdir: str, train_pairs=None) -> Tokenizer:
    """The tokenizer saved in `workdir`, or a new one trained on the training split.

    `train_pairs`: the whole training split if already loaded (else it is read,
    and only if the tokenizer has to be trained). DataError if the saved one
    was trained with other settings, or if training fails on the configured ones.
    """

    def train() -> Tokenizer:
        pairs = train_pairs if train_pairs is not None else load_split(data_config, "train").pairs
        sentences = training_sentences(pairs, data_config.tokenizer_sentences)
        return train_tokenizer(sentences, data_config.vocab_size,
                               model_type=data_config.tokenizer_type)

    try:
        return _load_or_train(tokenizer_path(workdir), vocabulary_settings(data_config), train)
    except ValueError as error:  # training on settings the user chose: say which ones
        if isinstance(error, DataError):
            raise
        raise DataError(f"tokenizer (config.data.vocab_size={data_config.vocab_size}, "
                        f"tokenizer_type={data_config.tokenizer_type!r}): {error}") from None


def _load_or_train(path: str, settings: dict, train) -> Tokenizer:
    """The tokenizer at `path` if trained with `settings`, or `train()`'s, saved there.

    Writes are atomic, so concurrent callers (e.g. one per host) at worst
    train the same deterministic model twice.
    """
    if os.path.exists(path):
        tokenizer = Tokenizer.load(path)
        _check_settings(path, settings, tokenizer)
        return tokenizer
    tokenizer = train()
    record = dict(settings, actual_vocab_size=tokenizer.vocab_size, version=SETTINGS_VERSION)
    # Settings first: a crash in between leaves no model, so the next call retrains.
    _write_atomically(settings_path(path), (json.dumps(record, indent=2) + "\n").encode())
    _write_atomically(path, tokenizer.model_proto)
    return tokenizer


def _check_settings(path: str, wanted: dict, tokenizer: Tokenizer) -> None:
    """DataError if the tokenizer at `path` was trained with other settings than `wanted`.

    The requested vocab_size is compared, not the model's: a corpus too small
    for it gives fewer pieces, and the same request should still reuse them.
    Settings the file does not record are named in a warning.
    """
    recorded, why_unrecorded = _recorded_settings(path, tokenizer)
    for key, value in wanted.items():
        if key in recorded and recorded[key] != value:
            raise DataError(
                f"{path!r} was trained with {key}={recorded[key]!r}, but config.data.{key}="
                f"{value!r}. Use the value it was trained with or another workdir; deleting "
                f"it and {settings_path(path)!r} trains a new one, which the run's "
                "checkpoints do not fit.")
    unchecked = [key for key in wanted if key not in recorded]
    if unchecked:
        warnings.warn(f"config.data.{', '.join(unchecked)} not checked against {path!r}: "
                      f"{why_unrecorded}", stacklevel=4)


def _recorded_settings(path: str, tokenizer: Tokenizer) -> tuple[dict, str]:
    """The settings recorded for the model at `path`, and why any could be missing."""
    try:
        with open(settings_path(path)) as f:
            recorded = json.load(f)
    except FileNotFoundError:  # a model copied alone, say: only its size is known
        return ({"vocab_size": tokenizer.vocab_size},
                f"{settings_path(path)!r}, which records them, is missing")
    if recorded.get("version", 1) == 1:
        return ({"vocab_size": recorded.get("vocab_size"),
                 "tokenizer_type": recorded.get("model_type")},
                f"{settings_path(path)!r} is from version 1, which did not record them")
    return recorded, f"{settings_path(path)!r} does not record them"


def _write_atomically(path: str, data: bytes) -> None:
    """Writes to a temporary file in the same directory, then renames it over `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"  # same directory, so os.replace is atomic
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
