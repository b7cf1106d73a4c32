"""The run's tokenizer: trained once on the training split, then reused from the workdir.

    WORKDIR/tokenizer.model        the SentencePiece model (`Tokenizer.load` reads it)
    WORKDIR/tokenizer.model.json   its record: the config.data settings and the training
                                   data it was trained on, and the model's SHA-256

Training, resuming, translating and evaluating share one vocabulary this way:
only the first `get_tokenizer` call trains. Both files are written whole or not
at all (`atomic_file`), the record first. What a later call does with them:

- A setting that changes the vocabulary (`vocabulary_settings`) recorded with
  another value: a DataError naming it, nothing trained. The run's checkpoints
  only make sense with the vocabulary they were trained with.
- A record that cannot vouch for the model: the training data changed (another
  file size or modification time; `sources.describe_split`, the same description
  the prepared ids' manifest records), the model is damaged (cut short, or not
  the model whose SHA-256 the record holds), the record is damaged, or it is from
  version 2 (which did not record the data). Training is deterministic, so the
  tokenizer is trained again from the current config and data: if that gives the
  model the files vouch for, both files are written anew with a one-line warning
  (a touched or copied corpus, a model cut short by a power cut); otherwise a
  DataError says why and what to do. A replaced corpus is thus refused rather
  than retrained: the workdir's checkpoints were trained on the old vocabulary,
  and resuming them with another one of the same size would go unnoticed.
  Deleting the record keeps the vocabulary for new data; deleting both files
  trains a new one.
- No record (a model copied alone) or a version 1 record (vocab_size and
  tokenizer_type only): checked as far as it goes; a warning names the rest.
  A damaged model without a record that names it: a DataError.
"""

import dataclasses
import functools
import itertools
import json
import os
import time
import warnings
from collections.abc import Callable

from transformer_jax.atomic_file import atomic_write
from transformer_jax.data.sources import (DataError, copied_folder, dataset_kind,
                                         describe_split, load_split, moved_folder,
                                         same_dataset)
from transformer_jax.data.tokenizer import Tokenizer, train_tokenizer

TOKENIZER_FILE = "tokenizer.model"
# 3 adds the training data (corpus) and the model's sha256; 2 records every key of
# VOCABULARY_SETTINGS; 1 recorded vocab_size and model_type only.
SETTINGS_VERSION = 3
# The config.data keys the vocabulary depends on: which sentences train it (the
# dataset, numbers_size for "numbers" only, the languages, in order, and how many
# sentences) and how they are cut into pieces. Not data_dir or download: where the
# data lives, and whether it may be fetched, do not change it.
VOCABULARY_SETTINGS = ("dataset", "numbers_size", "source_lang", "target_lang",
                       "tokenizer_sentences", "vocab_size", "tokenizer_type")


def tokenizer_path(workdir: str) -> str:
    """Where a run's tokenizer model is saved."""
    return os.path.join(workdir, TOKENIZER_FILE)


# The checkpoint metadata key of the SHA-256 of the tokenizer the run trained with.
CHECKPOINT_TOKENIZER_KEY = "tokenizer_sha256"


def other_tokenizer(metadata: dict, tokenizer: Tokenizer) -> str | None:
    """Why a checkpoint (its `metadata`) does not go with `tokenizer`: it was trained with
    a tokenizer of another SHA-256 (a vocabulary of the same size gives ids of other
    pieces: the model would read and write nonsense). None when it is the same, or when
    the checkpoint is from a version that did not record it."""
    saved = metadata.get(CHECKPOINT_TOKENIZER_KEY)
    if saved is None or saved == tokenizer.sha256:
        return None
    return (f"was trained with another tokenizer (SHA-256 {saved[:12]}...) than the "
            f"workdir's {TOKENIZER_FILE} ({tokenizer.sha256[:12]}...); put back the one it "
            f"was trained with")


def settings_path(model_path: str | os.PathLike) -> str:
    """Where the record (settings, training data, SHA-256) of the model at `model_path` is."""
    return os.fspath(model_path) + ".json"


def vocabulary_settings(data_config) -> dict:
    """The values of `data_config` that the vocabulary depends on, by key."""
    keys = [key for key in VOCABULARY_SETTINGS
            if key != "numbers_size" or dataset_kind(data_config.dataset)[0] == "numbers"]
    return {key: data_config[key] for key in keys}


def training_sentences(pairs, max_sentences: int):
    """Up to `max_sentences` sentences, both sides, from pairs spread evenly over `pairs`.

    Fixed positions (pair i · N // n of n pairs from N) rather than a random sample, so the
    same split gives the same sentences, and the same model, in every process.
    """
    count, wanted = len(pairs), max(1, -(-max_sentences // 2))  # pairs: 2 sentences each
    # Pair i · count // wanted: a whole stride (pairs[::9] of 9·wanted) where there is one,
    # else spread to the end, where a stride rounded down would stop part of the way.
    chosen = pairs if count <= wanted else (pairs[i * count // wanted] for i in range(wanted))
    sides = ((pair["source"], pair["target"]) for pair in chosen)
    return itertools.islice(itertools.chain.from_iterable(sides), max_sentences)


def get_tokenizer(data_config, workdir: str, train_pairs=None, *,
                  log: Callable[[str], None] = lambda line: None) -> Tokenizer:
    """The tokenizer saved in `workdir`, or a new one trained on the training split.

    `train_pairs`: the whole training split if already loaded (else it is read,
    and only if the tokenizer has to be trained). DataError if the saved one
    was trained with other settings or data, or if training fails on the
    configured settings (see the module's docstring). `log` gets a line as training
    starts and one as it ends: sentencepiece's trainer reports no progress of its own.
    """

    def train() -> Tokenizer:
        pairs = train_pairs if train_pairs is not None else load_split(data_config, "train").pairs
        if not pairs:  # not the vocabulary settings' fault, as train_tokenizer would say
            raise DataError(f"the training split of {data_config.dataset} has no pairs with "
                            f"text on both sides (pairs with an empty side are skipped); the "
                            f"tokenizer is trained on it")
        sentences = list(training_sentences(pairs, data_config.tokenizer_sentences))
        log(f"training the tokenizer: {data_config.vocab_size:,} "
            f"{data_config.tokenizer_type} pieces from {len(sentences):,} "
            f"sentence{'s' * (len(sentences) != 1)}")
        start = time.perf_counter()
        tokenizer = train_tokenizer(sentences, data_config.vocab_size,
                                    model_type=data_config.tokenizer_type)
        log(f"trained the tokenizer in {time.perf_counter() - start:.1f} s")
        return tokenizer

    wanted = _Wanted(vocabulary_settings(data_config),
                     lambda: describe_split(data_config, "train"), train)
    try:
        return _load_or_train(tokenizer_path(workdir), wanted)
    except ValueError as error:  # training on settings the user chose: say which ones
        if isinstance(error, DataError):
            raise
        raise DataError(f"tokenizer (config.data.vocab_size={data_config.vocab_size}, "
                        f"tokenizer_type={data_config.tokenizer_type!r}): {error}") from None


@dataclasses.dataclass
class _Wanted:
    """What the config asks for: its vocabulary settings, its training data (described
    only when needed: `corpus`), and how to train on that (`train()`)."""

    settings: dict
    describe: Callable[[], dict]
    train: Callable[[], Tokenizer]

    @functools.cached_property
    def corpus(self) -> dict:
        return self.describe()


def _load_or_train(path: str, wanted: _Wanted) -> Tokenizer:
    """The tokenizer at `path` if its record vouches for it, else trained (and saved)."""
    model, model_damage = _read_model(path)
    if model is None and model_damage is None:
        return _train_and_save(path, wanted)
    record, record_damage = _read_record(path)
    if record_damage is None and (record is None or record.get("version", 1) == 1):
        if model is None:
            raise DataError(_unvouched(path, f"{path} is damaged ({model_damage})"))
        _check_settings(path, wanted.settings,
                        *_legacy_settings(path, record, model, wanted.settings["vocab_size"]))
        return model
    if record is not None:
        _check_settings(path, wanted.settings, record, "",
                        moved=lambda: _moved(record, wanted))
    doubt, vouched = _doubt(path, model, model_damage, record, record_damage, wanted)
    if doubt is None:
        return model
    return _train_again(path, wanted, doubt, vouched, model_is_whole=model is not None)


def _moved(record: dict, wanted: _Wanted) -> bool:
    """Whether the wanted training data is the recorded data's folder moved (files of the
    same names and sizes: whether they changed is the training data's check, `_doubt`)."""
    try:
        corpus = wanted.corpus
    except DataError:  # the folder named now lacks a file: not the recorded one, moved
        return False
    return moved_folder(record.get("corpus"), corpus, times=False)


def _train_and_save(path: str, wanted: _Wanted) -> Tokenizer:
    """Trains a tokenizer on the wanted data and saves it at `path` with its record.
    Concurrent callers (e.g. one per host) at worst train the same model twice."""
    corpus = wanted.corpus  # before reading it: a file changed meanwhile counts as changed
    tokenizer = wanted.train()
    _save(path, wanted.settings, corpus, tokenizer)
    return tokenizer


def _save(path: str, settings: dict, corpus: dict, tokenizer: Tokenizer) -> None:
    """Writes the record, then the model, each whole or not at all: a crash in between
    leaves no model (the next call trains) or a record that does not vouch for the model."""
    record = dict(settings, actual_vocab_size=tokenizer.vocab_size, corpus=corpus,
                  sha256=tokenizer.sha256, version=SETTINGS_VERSION)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(settings_path(path), "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=2) + "\n")
    with atomic_write(path) as f:
        f.write(tokenizer.model_proto)


def _read_model(path: str) -> tuple[Tokenizer | None, str | None]:
    """(the tokenizer at `path`, None), (None, why it is damaged), or (None, None): no file."""
    try:
        with open(path, "rb") as f:
            model_proto = f.read()
    except FileNotFoundError:
        return None, None
    try:
        return Tokenizer(model_proto), None
    except ValueError as error:
        return None, str(error)


def _read_record(path: str) -> tuple[dict | None, str | None]:
    """(the record of the model at `path`, None), (None, why it is damaged), or (None, None):
    no record."""
    try:
        with open(settings_path(path), encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None, None
    except ValueError as error:  # cut short, or not UTF-8
        return None, f"not whole JSON: {error}"
    if not isinstance(record, dict):
        return None, f"not a JSON object but {type(record).__name__}"
    return record, None


def _doubt(path: str, model: Tokenizer | None, model_damage: str | None, record: dict | None,
           record_damage: str | None, wanted: _Wanted) -> tuple[str | None, set[str]]:
    """Why the record does not vouch for the model (None: it does), and the SHA-256s that a
    model trained again may have to be taken for the run's."""
    record_path = settings_path(path)
    if model is None:
        return f"{path} is damaged ({model_damage})", {(record or {}).get("sha256")} - {None}
    if record is None:
        return f"{record_path} is damaged ({record_damage})", {model.sha256}
    if "sha256" not in record or not isinstance(record.get("corpus"), dict):
        return (f"{record_path} is from version {record.get('version')}, which did not record "
                "the training data"), {model.sha256}
    if record["sha256"] != model.sha256:
        return (f"{path} is not the model {record_path} records (SHA-256 "
                f"{model.sha256[:12]}..., recorded {str(record['sha256'])[:12]}...)",
                {model.sha256, record["sha256"]})
    changes = describe_changes(record["corpus"], wanted.corpus)
    if changes:
        return f"the training data changed since {path} was trained ({changes})", {model.sha256}
    return None, set()


def describe_changes(recorded: dict, now: dict, *, was: str = "") -> str:
    """How the description `now` of the training data differs from `recorded` ("" if not,
    nor for a folder moved or copied: `moved_folder`, `copied_folder`), each change as
    "KEY: {was}OLD, now NEW"; of a folder's files, only those whose size or time differ, as
    "PATH: {was}SIZE bytes of TIME, now ..."."""
    if moved_folder(recorded, now) or copied_folder(recorded, now):
        return ""
    changes = []
    for key in sorted(k for k in recorded.keys() | now.keys() if recorded.get(k) != now.get(k)
                      and not (k == "dataset" and same_dataset(recorded.get(k), now.get(k)))):
        old, new = recorded.get(key), now.get(key)
        if key == "files" and isinstance(old, list) and isinstance(new, list) and len(
                old) == len(new):
            changes += [f"{n[0]}: {was}{_file_state(o)}, now {_file_state(n)}"
                        for o, n in zip(old, new) if _state(o) != _state(n)]
        else:
            changes.append(f"{key}: {was}{old!r}, now {new!r}")
    return "; ".join(changes)


def _state(entry):
    """A folder's file of describe_split, [path, size, mtime_ns], without its path."""
    return entry[1:] if isinstance(entry, list) else entry


def _file_state(entry) -> str:
    """'1,234 bytes of 2024-05-01 12:00:00.123' for describe_split's [path, size, mtime_ns]."""
    try:
        _, size, mtime_ns = entry
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime_ns // 10**9))
        return f"{size:,} bytes of {when}.{mtime_ns % 10**9 // 10**6:03d}"
    except (TypeError, ValueError):  # a record edited by hand
        return repr(entry)


def _train_again(path: str, wanted: _Wanted, doubt: str, vouched: set[str], *,
                 model_is_whole: bool) -> Tokenizer:
    """The tokenizer trained again, saved if it is one of the `vouched` models (a one-line
    warning says so); else a DataError that says `doubt` and what to do."""
    if not vouched:
        raise DataError(_unvouched(path, doubt))
    corpus = wanted.corpus  # before reading it, as in _train_and_save
    tokenizer = wanted.train()
    if tokenizer.sha256 not in vouched:
        keep = (f"delete {settings_path(path)} to keep using it unchecked, "
                if model_is_whole else "restore it from a copy, ")
        raise DataError(f"{doubt}, and training on the current data and config.data gives "
                        f"another vocabulary. Use another workdir, {keep}or delete {path} and "
                        f"{settings_path(path)} to train a new one, which this run's "
                        f"checkpoints and prepared ids do not fit.")
    _save(path, wanted.settings, corpus, tokenizer)
    warnings.warn(f"{doubt}; training again gives the same model ({tokenizer.sha256[:12]}...), "
                  f"so {path} and its record are written anew", stacklevel=4)
    return tokenizer


def _unvouched(path: str, doubt: str) -> str:
    """The message for a damaged model that no record names."""
    return (f"{doubt}, and no record names the model it was (its SHA-256). Restore it from a "
            f"copy, or delete {path} and {settings_path(path)} to train a new one, which this "
            f"run's checkpoints and prepared ids do not fit.")


def _check_settings(path: str, wanted: dict, recorded: dict, why_unrecorded: str,
                    moved: Callable[[], bool] = lambda: False) -> None:
    """DataError if the tokenizer at `path` was trained with other settings than `wanted`.

    The requested vocab_size is compared, not the model's: a corpus too small
    for it gives fewer pieces, and the same request should still reuse them.
    Another dataset is the same one if `moved()` (`_moved`).
    Settings the record does not hold are named in a warning (`why_unrecorded`).
    """
    for key, value in wanted.items():
        if key in recorded and recorded[key] != value and not (
                key == "dataset" and (same_dataset(recorded[key], value) or moved())):
            raise DataError(
                f"{path!r} was trained with {key}={recorded[key]!r}, but config.data.{key}="
                f"{value!r}. Use the value it was trained with or another workdir; deleting "
                f"it and {settings_path(path)!r} trains a new one, which the run's "
                "checkpoints do not fit.")
    unchecked = [key for key in wanted if key not in recorded]
    if why_unrecorded:
        keys = f"config.data.{', '.join(unchecked)} and " if unchecked else ""
        warnings.warn(f"{keys}the training data not checked against {path!r}: "
                      f"{why_unrecorded}", stacklevel=4)


def _legacy_settings(path: str, record: dict | None, tokenizer: Tokenizer,
                     requested: int) -> tuple[dict, str]:
    """The settings a version 1 record (or none) holds, and why the rest are missing."""
    if record is None:  # a model copied alone, say: only its size is known
        # A model smaller than the request may be the request capped by a small corpus
        # (SentencePiece keeps the pieces the text has): not comparable, so not compared.
        return ({"vocab_size": tokenizer.vocab_size} if tokenizer.vocab_size > requested
                else {},
                f"{settings_path(path)!r}, which records them, is missing")
    return ({"vocab_size": record.get("vocab_size"), "tokenizer_type": record.get("model_type")},
            f"{settings_path(path)!r} is from version 1, which did not record them")
