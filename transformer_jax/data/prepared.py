"""Token ids prepared once: each split tokenized and written to disk, then read by memory map.

    tokenizer, splits = prepare(config.data, workdir)   # tokenizes what is not prepared yet
    splits["train"][0]      # {"inputs": ids, "targets": ids}: a PreparedSplit

    WORKDIR/prepared/{split}/   the ids of `split` ("train", "validation"): prepared_split.py

Preparing is idempotent, resumable, checked, and refuses stale data:
- A split is written in parts, each whole or not at all, and renamed into place
  last, so a split folder is always complete and a rerun after a kill keeps the
  whole parts (prepared_writer.py).
- What is read is checked first, and a failure names the file (prepared_split.py).
  In `prepare` (train.py, the data command), a damaged split is deleted and
  prepared again with a one-line warning naming the file, since its ids are
  derived from the corpus and the tokenizer, both checked before (a stale record
  is refused first, when the manifest still reads); `open_split` alone raises a
  DataError naming the file.
- The manifest records what the ids were made from: the tokenizer (its SHA-256),
  the dataset, languages and source files (`sources.describe_split`). Opening a
  split whose record differs from the config's is a DataError naming the
  difference, never a silent reuse. Where only the files' times changed (touched,
  copied without -p, written again), `prepare` tokenizes the split again beside it and
  keeps it if the ids are the same, as the tokenizer is trained again and compared.
- In a multi-host run, process 0 prepares and the others wait, then open.
"""

import filecmp
import os
import shutil
import warnings

from transformer_jax.atomic_file import remove_temporaries
from transformer_jax.data.prepared_split import (
    FORMAT_VERSION,
    MANIFEST,
    DamagedFileError,
    PreparedSplit,
    read_manifest,
)
from transformer_jax.data.prepared_writer import write_json, write_split
from transformer_jax.data.sources import (DataError, copied_folder, dataset_kind,
                                         describe_split, load_split, moved_folder,
                                         read_folder_split, split_files)
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.vocabulary import (TOKENIZER_FILE, describe_changes, get_tokenizer,
                                             tokenizer_path)
from transformer_jax.output_paths import writable_folder

PREPARED_DIR = "prepared"
# The splits read as ids: training batches and the validation loss. The test split is
# only translated and scored, from its text (evaluate.py).
PREPARED_SPLITS = ("train", "validation")


def prepared_dir(workdir: str) -> str:
    """Where a run's prepared splits live."""
    return os.path.join(workdir, PREPARED_DIR)


def made_from(data_config, split: str, tokenizer: Tokenizer) -> dict:
    """What the ids of `split` depend on: the manifest's record, compared on every open."""
    return {"format": FORMAT_VERSION, "tokenizer_sha256": tokenizer.sha256,
            **describe_split(data_config, split)}


def open_split(data_config, workdir: str, split: str, tokenizer: Tokenizer) -> PreparedSplit:
    """The prepared `split` of `workdir`; DataError if it is missing, stale or damaged."""
    folder = os.path.join(prepared_dir(workdir), split)
    if not os.path.exists(os.path.join(folder, MANIFEST)):
        raise DataError(f"{split} is not prepared in {prepared_dir(workdir)}: run python -m "
                        f"transformer_jax.data prepare --config=... --workdir={workdir}")
    try:
        manifest = read_manifest(os.path.join(folder, MANIFEST))
        _refuse_stale(manifest["made_from"], made_from(data_config, split, tokenizer), folder)
        prepared = PreparedSplit(folder)
        prepared.check()
    except DamagedFileError as error:
        raise DamagedFileError(error.path, error.why, f": delete {folder} and run python -m "
                               f"transformer_jax.data prepare --config=... --workdir={workdir} "
                               "(or train.py) to prepare it again") from None
    return prepared


def _refuse_stale(recorded: dict, wanted: dict, folder: str) -> None:
    if diffs := describe_changes(recorded, wanted, was="prepared from "):
        raise DataError(f"{folder} is stale ({diffs}). Its ids no longer match the config; "
                        f"delete {folder} to prepare it again (a run's checkpoints were "
                        f"trained on the old ids), or use another workdir.")


def prepare(data_config, workdir: str, *, splits=PREPARED_SPLITS, log=print,
            processes: int | None = None) -> tuple[Tokenizer, dict[str, PreparedSplit]]:
    """Trains or loads the run's tokenizer, then tokenizes each of `splits` not yet prepared
    (or found damaged: prepared again, with a warning naming the file).

    Returns the tokenizer and the prepared splits; a stale one is a DataError.
    `log` gets one line per split with its size and rate. Runs alone on `workdir`
    (train.py and the data command hold its lock): it removes what kills left there.
    `processes`: how many worker processes tokenize a split (parallel_encoding.py); 0 for
    none (sentencepiece's threads, one per core, in this process); None for one per core
    (at most `prepared_writer.MAX_PROCESSES`) for a split of
    `prepared_writer.PROCESS_MIN_PAIRS` pairs or more and none for a smaller one.
    """
    try:
        return _prepare(data_config, workdir, splits, log, processes)
    except OSError as error:  # a full disk, a permission: what was whole is kept
        raise DataError(f"preparing the data failed: {error.filename or prepared_dir(workdir)}"
                        f": {error.strerror or error}; free space or fix the permissions, and "
                        f"run again: what was prepared whole is kept") from None


def _prepare(data_config, workdir: str, splits, log, processes):
    folders = {split: os.path.join(prepared_dir(workdir), split) for split in splits}
    if os.path.isdir(workdir):
        remove_temporaries(workdir, TOKENIZER_FILE)
    missing = [s for s in splits if not os.path.isdir(folders[s])]
    check_corpus_files(data_config, missing)  # before the first is read and tokenized
    # The training split is read only if something needs it: a resume reads no text.
    needs_train = "train" in missing or not os.path.exists(tokenizer_path(workdir))
    train = load_split(data_config, "train") if needs_train else None
    tokenizer = get_tokenizer(data_config, workdir, train.pairs if train is not None else None,
                              log=log)
    for split in splits:
        if split not in missing:
            _check_retimed(data_config, workdir, split, tokenizer, log, processes)
    for split in splits:  # a loop, not a comprehension: the warnings' stacklevel counts frames
        if split not in missing and _damaged(data_config, workdir, split, tokenizer):
            missing.append(split)
    for split in missing:
        pairs = train if split == "train" and train is not None else load_split(data_config,
                                                                                split)
        write_split(pairs, made_from(data_config, split, tokenizer), tokenizer, folders[split],
                     log, processes)
    if missing:
        _check_test_split(data_config)
    return tokenizer, {split: open_split(data_config, workdir, split, tokenizer)
                       for split in splits}


def made_workdir(data_config, workdir: str) -> str:
    """`writable_folder(workdir)` (train.py's and prepare's); for a new run, the corpus files
    it will tokenize checked first, so that a wrong path makes no workdir (a resume's ids
    are prepared: what it reads is checked as it is read)."""
    if workdir and not os.path.exists(workdir):
        check_corpus_files(data_config)
    return writable_folder(workdir)


def check_corpus_files(data_config, splits=PREPARED_SPLITS) -> None:
    """A DataError saying what is wrong unless a folder corpus holds the files of each of
    `splits` (those `prepare` would tokenize); other datasets are checked as they are read."""
    kind, folder = dataset_kind(data_config.dataset)
    if kind == "folder":
        for split in splits:
            split_files(folder, split, (data_config.source_lang, data_config.target_lang))


def _check_retimed(data_config, workdir: str, split: str, tokenizer: Tokenizer, log,
                   processes) -> None:
    """A prepared `split` whose corpus files changed only their modification times since,
    and perhaps their folder (touched, copied without -p, written again by a script), is
    tokenized again beside it: the same ids, and its record takes the files' new times and
    place, with a line in `log`; other ids (or a damaged split), and it is left for
    `open_split` to refuse as stale. The comparison's folder (SPLIT.again) is removed
    after, and before (what a kill left)."""
    folder = os.path.join(prepared_dir(workdir), split)
    again = f"{folder}.again"
    _remove_comparison(again)
    try:
        manifest = read_manifest(os.path.join(folder, MANIFEST))
        now = made_from(data_config, split, tokenizer)
        if not _times_only(manifest["made_from"], now):
            return
        PreparedSplit(folder).check()  # no comparison with damaged ids
    except (DamagedFileError, OSError):
        return  # missing or damaged: _damaged's to say
    log(f"prepared {split}: its corpus files' times changed since (touched or copied); "
        f"tokenizing it again to compare the ids")
    try:
        write_split(load_split(data_config, split), now, tokenizer, again, lambda line: None,
                    processes)
        if _same_ids(folder, again):
            write_json(os.path.join(folder, MANIFEST), {**manifest, "made_from": now})
            log(f"prepared {split}: the same ids; kept, with the files' new times")
        else:
            log(f"prepared {split}: other ids: the text changed")
    finally:
        _remove_comparison(again)


def _remove_comparison(again: str) -> None:
    for folder in (again, f"{again}.partial"):  # write_split's, and the one it writes through
        shutil.rmtree(folder, ignore_errors=True)


def _times_only(recorded: dict, now: dict) -> bool:
    """Whether two `made_from` records differ in their files' modification times alone, or
    in those and their folder (`moved_folder`): the same names and sizes, all else equal.
    (A folder moved with its times, or copied while it is still as recorded
    (`copied_folder`), is the same dataset: nothing to compare.)"""
    def without_times(record: dict) -> dict:
        return {**record, "files": [list(entry[:2]) for entry in record["files"]]}

    if recorded == now or moved_folder(recorded, now) or copied_folder(recorded, now):
        return False
    try:
        return (without_times(recorded) == without_times(now)
                or moved_folder(recorded, now, times=False))
    except (KeyError, TypeError):  # not a folder's files (or a record edited by hand)
        return False


def _same_ids(folder: str, again: str) -> bool:
    """Whether two prepared split folders hold the same arrays, byte for byte."""
    names = sorted(name for name in os.listdir(again) if name != MANIFEST)
    try:
        return names == sorted(n for n in os.listdir(folder) if n != MANIFEST) and all(
            filecmp.cmp(os.path.join(folder, n), os.path.join(again, n), shallow=False)
            for n in names)
    except OSError:
        return False


def _check_test_split(data_config) -> None:
    """A warning, now rather than after training, when a folder corpus's test split cannot
    be read (missing, misaligned, not UTF-8): evaluate.py translates it."""
    kind, folder = dataset_kind(data_config.dataset)
    if kind == "folder":
        try:
            read_folder_split(folder, "test", data_config.source_lang, data_config.target_lang)
        except DataError as error:
            warnings.warn(f"the test split cannot be read, and evaluate.py will need it after "
                          f"training: {error}", stacklevel=4)


def _damaged(data_config, workdir: str, split: str, tokenizer: Tokenizer) -> bool:
    """True if prepared `split` was damaged: it is then deleted, with a warning naming the
    file. A stale split is a DataError, as in `open_split`."""
    manifest = os.path.join(prepared_dir(workdir), split, MANIFEST)
    try:
        if not os.path.exists(manifest):  # only ever renamed into place with one
            raise DamagedFileError(manifest, "missing")
        open_split(data_config, workdir, split, tokenizer)
    except DamagedFileError as error:
        warnings.warn(f"{error.path} is damaged ({error.why}); preparing {split} again",
                      stacklevel=3)
        shutil.rmtree(os.path.join(prepared_dir(workdir), split))
        return True
    return False
