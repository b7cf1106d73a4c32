"""Sentence pairs from the three kinds of source, read into memory.

`config.data.dataset` picks one:

    "numbers"      the built-in offline dataset (numbers in words, de/en)
    "tfds:NAME"    any TFDS translation dataset, e.g. "tfds:wmt14_translate/de-en"
    "folder:PATH"  a user's corpus: PATH/{split}.{lang}, UTF-8, aligned line by line

Every source gives pairs `{"source": str, "target": str}` in the configured direction.
Problems a user can fix raise `DataError` with a message that says how.
"""

import dataclasses
import filecmp
import importlib
import inspect
import os
import pkgutil
import stat
import sys

import tqdm

SPLITS = ("train", "validation", "test")


class DataError(ValueError):
    """A dataset that cannot be read as configured; the message says what to do."""


def dataset_kind(dataset: str) -> tuple[str, str]:
    """`config.data.dataset` as (kind, argument): ("numbers", ""), ("tfds", NAME) or
    ("folder", PATH); a DataError naming the three forms for anything else."""
    kind, _, arg = str(dataset).partition(":")
    if dataset == "numbers" or (kind in ("tfds", "folder") and arg):
        return kind, arg
    raise DataError(f"unknown dataset {dataset!r}; use \"numbers\", "
                    "\"tfds:NAME\" (e.g. tfds:wmt14_translate/de-en) or \"folder:PATH\"")


def absolute_dataset(dataset: str) -> str:
    """`dataset` with a folder's path made absolute (~ expanded, links kept), as a run
    records it: a relative path would be read from the folder of each later command."""
    kind, arg = dataset_kind(dataset)
    return f"folder:{os.path.abspath(os.path.expanduser(arg))}" if kind == "folder" else dataset


def same_dataset(a, b) -> bool:
    """Whether two `config.data.dataset` values name the same data: a folder however it is
    written (relative, absolute, with ~ or a trailing /, through a link) is one dataset."""
    return _resolved(a) == _resolved(b)


def _resolved(dataset):
    kind, _, arg = str(dataset).partition(":")
    if kind == "folder" and arg:
        return f"folder:{os.path.realpath(os.path.expanduser(arg))}"
    return dataset


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a corpus, read into memory (this process's share of it)."""

    name: str
    pairs: list  # {"source": str, "target": str}, in the source's order
    skipped_empty: int  # pairs dropped for an empty or blank side

    def __len__(self) -> int:
        return len(self.pairs)


def has_text(pair) -> bool:
    """False for pairs with an empty or whitespace-only side (they are skipped)."""
    return bool(pair["source"].strip()) and bool(pair["target"].strip())


def load_split(data_config, split: str, *, shard_index: int = 0, shard_count: int = 1) -> Split:
    """Reads the pairs `shard_index::shard_count` of a split into memory.

    In memory because array_record reads one record in about 0.3 ms but
    thousands at once in about 20 us each: the whole of "numbers" loads in
    seconds, and then shuffling and packing never wait on the disk.
    """
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    kind, arg = dataset_kind(data_config.dataset)
    if kind == "numbers":
        from transformer_jax.data.numbers import prepare_numbers  # the builder needs tfds

        builder = prepare_numbers(data_config.data_dir, config=data_config.numbers_size)
        records = builder.as_data_source(split=split)
    elif kind == "tfds":
        records = _tfds_records(arg, split, data_config)
    else:
        pairs = read_folder_split(arg, split, data_config.source_lang, data_config.target_lang)
        return _keep_text(split, pairs[shard_index::shard_count])
    _check_languages(records, data_config)
    indices = range(shard_index, len(records), shard_count)
    return _keep_text(split, _read_pairs(records, indices, data_config, f"{kind} {split}"))


def describe_split(data_config, split: str) -> dict:
    """What a split's pairs come from, cheaply (nothing is read): the dataset, its
    version or files (size and modification time), the languages. Equal descriptions
    mean the same pairs, so ids prepared from one serve the other."""
    kind, arg = dataset_kind(data_config.dataset)
    about = {"dataset": data_config.dataset, "split": split,
             "languages": [data_config.source_lang, data_config.target_lang]}
    if kind == "numbers":
        from transformer_jax.data.numbers import Numbers

        return {**about, "numbers_size": data_config.numbers_size,
                "version": str(Numbers.VERSION)}
    if kind == "tfds":
        builder = _tfds_builder(arg, data_config)
        splits = builder.info.splits  # empty for an unprepared (or mocked) dataset
        return {**about, "version": str(builder.version),
                "pairs": splits[split].num_examples if split in splits else None}
    files = split_files(arg, split, about["languages"])
    stats = [os.stat(f) for f in files]
    return {**about, "files": [[os.path.abspath(f), s.st_size, s.st_mtime_ns]
                               for f, s in zip(files, stats)]}


def _read_pairs(records, indices, data_config, what: str, chunk: int = 4096) -> list:
    """Reads TFDS records in chunks (one `__getitems__` call each) as str pairs."""
    src, tgt = data_config.source_lang, data_config.target_lang
    read_many = getattr(records, "__getitems__", lambda ids: [records[i] for i in ids])
    pairs = []
    with tqdm.tqdm(total=len(indices), desc=f"reading {what}", unit="pair", leave=False,
                   disable=len(indices) < 50_000) as progress:
        for start in range(0, len(indices), chunk):
            for record in read_many(list(indices[start:start + chunk])):
                pairs.append({"source": _text(record[src]), "target": _text(record[tgt])})
            progress.update(min(chunk, len(indices) - start))
    return pairs


def _text(value) -> str:
    # Real TFDS records hold bytes; tfds.testing.mock_data yields str.
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _keep_text(split: str, pairs: list) -> Split:
    kept = [pair for pair in pairs if has_text(pair)]
    return Split(split, kept, len(pairs) - len(kept))


def _check_languages(records, data_config) -> None:
    if len(records) == 0:
        return
    found = set(records[0])
    wanted = {data_config.source_lang, data_config.target_lang}
    if not wanted <= found:
        raise DataError(f"{data_config.dataset} has languages {sorted(found)}, but the config "
                        f"asks for source_lang={data_config.source_lang!r} and "
                        f"target_lang={data_config.target_lang!r}")


def _tfds_records(name: str, split: str, data_config):
    """A TFDS random-access data source (array_record), prepared if needed."""
    builder = _tfds_builder(name, data_config)
    if not builder.is_prepared():
        _prepare(builder, name, data_config)
    try:
        return builder.as_data_source(split=split)
    except (KeyError, ValueError):
        raise DataError(f"{name} has no split {split!r}; it has "
                        f"{', '.join(builder.info.splits) or 'none'}") from None


def _tfds_builder(name: str, data_config):
    """TFDS's builder of `name` (array_record); a DataError naming the translation datasets
    it knows if it has no such dataset."""
    import tensorflow_datasets as tfds

    _import_translation_builders()
    try:
        return tfds.builder(name, data_dir=data_config.data_dir, file_format="array_record")
    except tfds.core.registered.DatasetNotFoundError:
        raise DataError(f"TFDS has no dataset {name!r}. Translation datasets it knows: "
                        f"{', '.join(translation_datasets())}") from None


def _prepare(builder, name: str, data_config) -> None:
    where = data_config.data_dir or "~/tensorflow_datasets"
    help_text = (
        f"Prepare it on a machine with internet access (python -c \"import tensorflow_datasets "
        f"as tfds; tfds.builder('{name}', file_format='array_record').download_and_prepare()\"), "
        f"then copy the data directory here and point config.data.data_dir (or TFDS_DATA_DIR) "
        f"at it; datasets with manual downloads read them from <data_dir>/downloads/manual.")
    if not data_config.download:
        raise DataError(f"{name} is not prepared in {where}, and config.data.download is "
                        f"False. {help_text}")
    # TFDS retries each URL 10 times, backing off from 0.2 s to 102 s (205 s of waiting):
    # say so first, or an offline start looks hung behind urllib3's retry warnings.
    tqdm.tqdm.write(f"preparing {name} in {where} (array_record): downloading it; without a "
                    f"network TFDS retries for about 3.5 minutes before giving up "
                    f"(--config.data.download=false stops at once)", file=sys.stderr)
    try:
        builder.download_and_prepare(file_format="array_record")
    except Exception as error:  # network, manual-download and missing-TF errors all land here
        raise DataError(f"{name} is not prepared in {where} and could not be prepared here "
                        f"({type(error).__name__}: {str(error)[:300]}). {help_text}") from error


def _import_translation_builders() -> None:
    """Registers TFDS's translation builders (without TensorFlow, tfds imports them lazily)."""
    import tensorflow_datasets.translate as translate

    for module in pkgutil.iter_modules(translate.__path__):
        if not module.name.endswith("_test"):
            importlib.import_module(f"{translate.__name__}.{module.name}")


def translation_datasets() -> list[str]:
    """Names of the TFDS translation datasets (the builders in tensorflow_datasets.translate)."""
    import tensorflow_datasets as tfds

    _import_translation_builders()
    names, classes = set(), [tfds.core.DatasetBuilder]
    while classes:
        for cls in classes.pop().__subclasses__():
            classes.append(cls)
            if cls.__module__.startswith("tensorflow_datasets.translate"):
                if not inspect.isabstract(cls):
                    names.add(cls.name)
    return sorted(names)


# A copy to another file system may keep a file's time to the microsecond or 100 ns only.
MOVED_MTIME_TOLERANCE_NS = 1_000_000


def moved_folder(recorded: dict, now: dict, *, times: bool = True) -> bool:
    """Whether two `describe_split`s (or records holding one) are of one folder's split in
    another folder: all the same but the folder, and its files the same by name, size and
    (if `times`) modification time to the millisecond, which mv, cp -p and rsync -a keep."""
    def parts(about: dict):
        rest = {k: v for k, v in about.items() if k not in ("dataset", "files")}
        files = [(os.path.basename(path), size, int(mtime_ns))
                 for path, size, mtime_ns in about["files"]]
        return dataset_kind(about["dataset"])[0], rest, files

    try:
        (kind, rest, files), (kind_now, rest_now, files_now) = parts(recorded), parts(now)
    except (AttributeError, KeyError, TypeError, ValueError):  # not a folder's (or edited)
        return False
    return (kind == kind_now == "folder" and rest == rest_now and len(files) == len(files_now)
            and all(name == name_now and size == size_now and (
                not times or abs(mtime - mtime_now) < MOVED_MTIME_TOLERANCE_NS)
                for (name, size, mtime), (name_now, size_now, mtime_now)
                in zip(files, files_now)))


def copied_folder(recorded: dict, now: dict) -> bool:
    """Whether `now` describes a copy of the recorded folder's split while that folder is
    still as recorded: its files in place with their recorded sizes and times, and the
    copy's files of the same names equal to them byte for byte (compared only then). Such
    a copy is the same data, so records of the original stay true of it and stay as they
    are: a second folder used once (say, to look at it) does not rewrite a run's records."""
    if not moved_folder(recorded, now, times=False):
        return False
    try:
        for (path, size, mtime_ns), (path_now, _, _) in zip(recorded["files"], now["files"]):
            about = os.stat(path)
            if (about.st_size, about.st_mtime_ns) != (size, mtime_ns) or not filecmp.cmp(
                    path, path_now, shallow=False):
                return False
    except OSError:  # the recorded folder moved or went away: not a copy
        return False
    return True


def read_folder_split(folder: str, split: str, source_lang: str, target_lang: str) -> list[dict]:
    """The pairs of `folder/{split}.{source_lang}` and `folder/{split}.{target_lang}`."""
    paths = split_files(folder, split, (source_lang, target_lang))
    sources, targets = (read_lines(p) for p in paths)
    if len(sources) != len(targets):
        raise DataError(f"{paths[0]} has {len(sources):,} line{'s' * (len(sources) != 1)} "
                        f"but {paths[1]} has {len(targets):,}: the files of a split must be "
                        "aligned line by line")
    return [{"source": s, "target": t} for s, t in zip(sources, targets)]


def split_files(folder: str, split: str, languages) -> list[str]:
    """The paths `folder/{split}.{lang}` (~ expanded); a DataError saying what is wrong
    unless each is a regular file (or a link to one). Checked before reading: opening a
    FIFO would wait for a writer forever."""
    given, folder = folder, os.path.expanduser(folder)
    if not os.path.isdir(folder):
        where = (f" (from {os.getcwd()})" if not os.path.isabs(folder) else
                 f" ({folder})" if folder != given else "")
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise DataError(f"dataset folder {given!r}{where} {what}; set "
                        f"--config.data.dataset=folder:PATH, the folder that holds "
                        f"{split}.{languages[0]} and {split}.{languages[1]}")
    paths = [os.path.join(folder, f"{split}.{lang}") for lang in languages]
    problems = [(p, why) for p in paths if (why := _not_a_file(p))]
    if problems:
        missing = [p for p, why in problems if why == "missing"]
        others = [f"{p} {why}" for p, why in problems if why != "missing"]
        names = sorted(os.listdir(folder))
        listing = ", ".join(names) or "nothing"
        raise DataError("; ".join(([f"missing {', '.join(missing)}"] if missing else []) +
                                  others + [f"{folder} holds: {listing}"]) +
                        _missing_hint(split, languages, names) * bool(missing))
    return paths


def _missing_hint(split: str, languages, names: list[str]) -> str:
    """What to do about missing files of `split`: the keys that name a language no file of
    the folder has; for validation, that empty files make a run without evaluation."""
    unknown = [lang for lang in languages if not any(n.endswith(f".{lang}") for n in names)]
    if unknown:
        keys = " and ".join(f"config.data.{side}_lang={lang!r}"
                            for side, lang in zip(("source", "target"), languages))
        return f" (the files are named for {keys})"
    if split == "validation":
        return " (empty validation files train a run without evaluation)"
    return ""


def _not_a_file(path: str) -> str | None:
    """None for a regular file, else what `path` is instead ("missing", "is a directory")."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a broken link (to {os.readlink(path)})"
        return "missing"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device or socket"
    return f"is {kind}, not a regular file"


def read_lines(path: str) -> list[str]:
    """`decode_lines` of the file at `path`; a DataError naming it when it cannot be read
    (a permission, an I/O error)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from None
    return decode_lines(data, path, advice="; if the file is in another encoding, convert it, "
                                           "e.g. iconv -f LATIN1 -t UTF-8 for Latin-1")


def decode_lines(data: bytes, where: str, first_line: int = 1, advice: str = "") -> list[str]:
    """Lines of UTF-8 text, split on "\\n" only, so that other separators (\\x0b, \\x85,
    U+2028, ...) keep files line-aligned; a byte-order mark that starts the text is dropped,
    and "\\r\\n" ends a line like "\\n". `where` names the text in the DataError for invalid
    UTF-8 (`advice` ends it), and `data` starts at line `first_line` of it (after line 1, a
    BOM is text)."""
    if first_line == 1 and data.startswith((b"\xff\xfe", b"\xfe\xff")):  # line 1 is not at fault
        raise DataError(f"{where} is UTF-16 (it starts with UTF-16's byte-order mark), not "
                        f"UTF-8; convert it, e.g. iconv -f UTF-16 -t UTF-8")
    try:
        text = data.decode("utf-8")
        text = text.removeprefix("\ufeff") if first_line == 1 else text
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + first_line
        column = error.start - data.rfind(b"\n", 0, error.start)  # 1-based, in bytes
        raise DataError(f"{where}, line {line}: not valid UTF-8 ({error.reason} at byte "
                        f"{column} of the line){advice}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return [line.removesuffix("\r") for line in lines]
