"""Token ids prepared once: each split tokenized and written to disk, then read by memory map.

    WORKDIR/prepared/{split}/inputs.npy           every pair's source ids (EOS included), end to end
    WORKDIR/prepared/{split}/targets.npy          the same for the targets
    WORKDIR/prepared/{split}/inputs_offsets.npy   (N + 1,) int64: pair i is inputs[o[i]:o[i + 1]]
    WORKDIR/prepared/{split}/targets_offsets.npy
    WORKDIR/prepared/{split}/manifest.json        what it was made from; written last

    tokenizer, splits = prepare(config.data, workdir)   # tokenizes what is not prepared yet
    splits["train"][0]      # {"inputs": ids, "targets": ids}: a PreparedSplit

The format is NumPy's .npy, read with `np.load(mmap_mode="r")`, rather than
array_record: a batch's ids are one fancy-index gather from a contiguous array
(array_record deserializes record by record), the offsets are the index of
lengths that packing plans with, and the operating system's page cache shares
the files between grain's worker processes. This is the layout of fairseq's
and Megatron's indexed datasets. Ids are uint16 when the vocabulary fits (half
the disk and page cache of int32), else int32; readers get int32.

Preparing is idempotent, resumable, checked, and refuses stale data:
- Every file is written whole or not at all (`atomic_file`: a temporary name,
  fsync, rename). A split is written into `{split}.partial/` in parts of
  `PART_PAIRS` pairs; a rerun after a kill keeps the whole parts and redoes the
  rest. The split's folder is renamed into place last, so a split folder is
  always complete; nothing else is ever read.
- What is read is checked first, and a failure names the file. A part left by
  an earlier attempt is read whole (its zip CRC-32s, its pairs' count and dtype);
  a damaged one (a power cut before it reached the disk, a disk error) is
  tokenized again with a one-line warning: parts are only ever derived data.
  Opening a split checks that its manifest parses, that each array has the dtype
  and length the manifest says, and that the offsets start at 0, rise and end at
  the ids' length (the ids carry no checksum: every start would read them in
  full to check it). In `prepare` (train.py, the data
  command), a damaged split is deleted and prepared again with a one-line
  warning naming the file, since its ids are derived from the corpus and the
  tokenizer, both checked before (a stale record is refused first, when the
  manifest still reads); `open_split` alone raises a DataError naming the file.
- The manifest records what the ids were made from: the tokenizer (its SHA-256),
  the dataset, languages and source files (`sources.describe_split`). Opening a
  split whose record differs from the config's is a DataError naming the
  difference, never a silent reuse.
- In a multi-host run, process 0 prepares and the others wait, then open.
"""

import contextlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterator

import numpy as np
import tqdm

from transformer_jax.atomic_file import atomic_write, remove_temporaries, sync_folder
from transformer_jax.data.parallel_encoding import encode_in_processes, usable_cores
from transformer_jax.data.sources import DataError, describe_split, load_split
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.vocabulary import TOKENIZER_FILE, get_tokenizer, tokenizer_path

PREPARED_DIR = "prepared"
# The splits read as ids: training batches and the validation loss. The test split is
# only translated and scored, from its text (evaluate.py).
PREPARED_SPLITS = ("train", "validation")
SIDES = ("inputs", "targets")
PAIR_KEYS = ("source", "target")  # the text of each of SIDES in a pair
PART_PAIRS = 250_000  # pairs per part: the work a kill can lose
# Splits this large are tokenized by worker processes (parallel_encoding.py) unless
# `prepare(processes=)` says otherwise: below it, starting them (about 1.5 s) costs more
# than they save. The numbers dataset's 200,000 pairs stay in process.
PROCESS_MIN_PAIRS = 250_000
# At most this many by default, however many cores: each holds about 200 MB (it imports
# JAX), and the calling process's own share (sending texts, joining arrays: 4 % of the
# work on 2 cores) leaves little to gain beyond it.
MAX_PROCESSES = 32
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MADE_FROM = "made_from.json"  # in {split}.partial/ while its parts are written


class DamagedFileError(DataError):
    """A prepared file that does not hold what it should: `path` names it, `why` says how."""

    def __init__(self, path: str, why: str, advice: str = ""):
        super().__init__(f"{path} is damaged ({why}){advice}")
        self.path, self.why = path, why


def prepared_dir(workdir: str) -> str:
    """Where a run's prepared splits live."""
    return os.path.join(workdir, PREPARED_DIR)


def made_from(data_config, split: str, tokenizer: Tokenizer) -> dict:
    """What the ids of `split` depend on: the manifest's record, compared on every open."""
    return {"format": FORMAT_VERSION, "tokenizer_sha256": tokenizer.sha256,
            **describe_split(data_config, split)}


class PreparedSplit:
    """One prepared split, read by memory map: a grain random-access data source.

    `split[i]` is {"inputs": ids, "targets": ids} (int32, EOS included); `lengths(side)`
    is every pair's length on one side, the index packing plans with. Pickles as its
    folder, so grain workers open their own maps. Opening checks that each file holds
    the dtype and length the manifest says (DamagedFileError naming it); `check()`
    reads the offsets through.
    """

    def __init__(self, folder: str):
        self.folder = folder
        self.manifest = read_manifest(os.path.join(folder, MANIFEST))
        dtype, pairs = self.manifest["dtype"], self.manifest["pairs"]
        self._ids, self._offsets, self._lengths = {}, {}, {}
        for side in SIDES:  # plain arrays over the maps: np.memmap's indexing is slower
            self._ids[side] = _open_array(os.path.join(folder, f"{side}.npy"), dtype,
                                          self.manifest["tokens"][side])
            self._offsets[side] = _open_array(os.path.join(folder, f"{side}_offsets.npy"),
                                              "int64", pairs + 1)

    def __reduce__(self):
        return (PreparedSplit, (self.folder,))

    def __len__(self) -> int:
        return self.manifest["pairs"]

    def __getitem__(self, i) -> dict[str, np.ndarray]:
        i = range(len(self))[i]  # negative indices; IndexError past the end
        return {side: np.asarray(self._ids[side][o[i]:o[i + 1]], np.int32)
                for side, o in self._offsets.items()}

    def check(self) -> None:
        """DamagedFileError unless each side's offsets start at 0, rise (every pair holds
        its EOS at least) and end at the ids' length: every pair's ids lie in the file."""
        for side, offsets in self._offsets.items():
            if offsets[0] != 0 or offsets[-1] != len(self._ids[side]) or (
                    len(offsets) > 1 and np.diff(offsets).min() < 1):
                raise DamagedFileError(os.path.join(self.folder, f"{side}_offsets.npy"),
                                       "its offsets do not run from 0 up to the ids' length")

    def lengths(self, side: str) -> np.ndarray:
        """(N,) int32, read-only: the number of ids of each pair on `side` ("inputs" or
        "targets"); computed once."""
        if side not in self._lengths:
            self._lengths[side] = np.diff(self._offsets[side]).astype(np.int32)
            self._lengths[side].flags.writeable = False
        return self._lengths[side]

    def gather(self, side: str, indices: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The first `counts[k]` ids of pair `indices[k]`, for every k, end to end (int32).
        Each `counts[k]` must be at most that pair's length (callers cut to the rows)."""
        starts = np.asarray(self._offsets[side][indices], np.int64)
        counts = np.asarray(counts, np.int64)
        begins = np.cumsum(counts) - counts  # where each pair's ids begin in the result
        where = np.repeat(starts - begins, counts) + np.arange(counts.sum())
        return np.asarray(self._ids[side][where], np.int32)


def read_manifest(path: str) -> dict:
    """The manifest at `path`; DamagedFileError if it is not whole (cut short, a field
    missing or of the wrong type)."""
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        fields = {"made_from": dict(manifest["made_from"]), "pairs": int(manifest["pairs"]),
                  "dtype": np.dtype(manifest["dtype"]).name,
                  "tokens": {side: int(manifest["tokens"][side]) for side in SIDES}}
    except (ValueError, KeyError, TypeError) as error:
        raise DamagedFileError(path, f"{type(error).__name__}: {error}") from None
    return {**manifest, **fields}


def _open_array(path: str, dtype: str, length: int) -> np.ndarray:
    """The 1-D array of `length` items of `dtype` in the .npy file at `path`, by memory map;
    DamagedFileError if the file holds anything else or is cut short."""
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as error:
        raise DamagedFileError(path, f"{type(error).__name__}: {error}") from None
    if array.dtype != dtype or array.shape != (length,):
        raise DamagedFileError(path, f"it holds {array.dtype} {array.shape}, its manifest "
                                     f"says {dtype} ({length},)")
    return np.asarray(array)


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
    changed = sorted(k for k in recorded.keys() | wanted.keys() if recorded.get(k) != wanted.get(k))
    if changed:
        diffs = "; ".join(f"{k}: prepared from {recorded.get(k)!r}, now {wanted.get(k)!r}"
                          for k in changed)
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
    (at most `MAX_PROCESSES`) for a split of `PROCESS_MIN_PAIRS` pairs or more and none
    for a smaller one.
    """
    folders = {split: os.path.join(prepared_dir(workdir), split) for split in splits}
    if os.path.isdir(workdir):
        remove_temporaries(workdir, TOKENIZER_FILE)
    missing = [s for s in splits if not os.path.isdir(folders[s])]
    # The training split is read only if something needs it: a resume reads no text.
    needs_train = "train" in missing or not os.path.exists(tokenizer_path(workdir))
    train = load_split(data_config, "train") if needs_train else None
    tokenizer = get_tokenizer(data_config, workdir, train.pairs if train is not None else None)
    for split in splits:  # a loop, not a comprehension: the warnings' stacklevel counts frames
        if split not in missing and _damaged(data_config, workdir, split, tokenizer):
            missing.append(split)
    for split in missing:
        pairs = train if split == "train" and train is not None else load_split(data_config,
                                                                                split)
        _write_split(pairs, made_from(data_config, split, tokenizer), tokenizer, folders[split],
                     log, processes)
    return tokenizer, {split: open_split(data_config, workdir, split, tokenizer)
                       for split in splits}


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


def worker_processes(pairs: int, processes: int | None = None) -> int:
    """How many worker processes tokenize `pairs` pairs, for `prepare(processes=...)`:
    0 means none (sentencepiece's threads in this process), and so does 1."""
    if processes is None:
        processes = min(usable_cores(), MAX_PROCESSES) if pairs >= PROCESS_MIN_PAIRS else 0
    return processes if processes > 1 else 0  # one would only wait for the other


def _write_split(split, record: dict, tokenizer: Tokenizer, folder: str, log,
                 processes: int | None) -> None:
    """Tokenizes `split` (a sources.Split) into `folder`, through `folder`.partial, with
    `prepare`'s `processes`."""
    partial = folder + ".partial"
    started = _start_partial(partial, record)
    manifest = _joined_manifest(partial)  # a kill while moving the split into place
    workers = None  # how many processes tokenized (0: threads); None: nothing was left
    if manifest is None:
        dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
        num_parts, workers = _write_parts(split, tokenizer, dtype, partial, processes)
        tokens = _join_parts(partial, num_parts, dtype)
        manifest = {"made_from": record, "pairs": len(split.pairs),
                    "skipped_empty": split.skipped_empty, "dtype": np.dtype(dtype).name,
                    "tokens": tokens}
        _write_json(os.path.join(partial, MANIFEST), manifest)
    _move_into_place(partial, folder)
    seconds, pairs = time.perf_counter() - started, len(split.pairs)
    how = ("nothing left to tokenize" if workers is None else
           f"{workers} worker processes" if workers else f"{usable_cores()} threads")
    log(f"prepared {split.name}: {pairs:,} pairs, {sum(manifest['tokens'].values()):,} tokens "
        f"in {seconds:.1f} s ({pairs / max(seconds, 1e-9):,.0f} pairs/s, {how})")


def _start_partial(partial: str, record: dict) -> float:
    """Keeps the whole files of an earlier attempt made from `record`; else starts afresh."""
    if _partial_record(partial) == record:
        remove_temporaries(partial)  # writes a kill cut short: never renamed into place
    else:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        _write_json(os.path.join(partial, MADE_FROM), record)
    return time.perf_counter()


def _partial_record(partial: str) -> dict | None:
    """What an earlier attempt in `partial` was made from: its made_from.json, or once the
    parts are joined, its manifest's record; None if neither reads."""
    for name in (MADE_FROM, MANIFEST):
        try:
            with open(os.path.join(partial, name), encoding="utf-8") as f:
                recorded = json.load(f)
            return recorded if name == MADE_FROM else recorded["made_from"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _joined_manifest(partial: str) -> dict | None:
    """The manifest of `partial` if its parts were joined into whole arrays, else None."""
    if not os.path.exists(os.path.join(partial, MANIFEST)):
        return None
    try:
        joined = PreparedSplit(partial)
        joined.check()
    except DamagedFileError:
        return None
    return joined.manifest


def _part_path(partial: str, k: int) -> str:
    return os.path.join(partial, f"part-{k:05d}.npz")


def _write_parts(split, tokenizer: Tokenizer, dtype, partial: str,
                 processes: int | None) -> tuple[int, int | None]:
    """Tokenizes the parts of `split` that `partial` lacks whole, with `prepare`'s
    `processes` for the pairs left; returns the number of parts and of worker processes
    used (0: threads; None: no part was left)."""
    pairs = split.pairs
    starts = range(0, len(pairs), PART_PAIRS)
    todo = []  # (path, first pair, pairs) of each part to tokenize
    for k, start in enumerate(starts):
        path, size = _part_path(partial, k), min(PART_PAIRS, len(pairs) - start)
        damage = _part_damage(path, size, dtype) if os.path.exists(path) else "none"
        if damage is not None:
            if damage != "none":
                warnings.warn(f"{path} is damaged ({damage}); tokenizing its "
                              f"{size:,} pairs again", stacklevel=4)
            todo.append((path, start, size))
    left = sum(size for *_, size in todo)
    workers = worker_processes(left, processes) if todo else None
    parts = _encoded_parts(pairs, [(start, start + size) for _, start, size in todo],
                           tokenizer, dtype, workers)
    with contextlib.closing(parts), tqdm.tqdm(
            total=len(pairs), initial=len(pairs) - left, desc=f"preparing {split.name}",
            unit="pair", disable=len(pairs) < 50_000) as progress:
        for (path, _, size), arrays in zip(todo, parts):
            _write_part(path, arrays)
            progress.update(size)
    return len(starts), workers


def _encoded_parts(pairs: list, parts: list[tuple[int, int]], tokenizer: Tokenizer, dtype,
                   processes: int) -> Iterator[dict[str, np.ndarray]]:
    """The arrays of each part `pairs[start:stop]` of `parts`, in order: encoded by
    `processes` worker processes, each part's sides cut into a piece per process; or with
    0, here, on sentencepiece's threads."""
    if not processes:
        for start, stop in parts:
            yield _part_arrays(tokenizer.encode_arrays(
                [p[key] for p in pairs[start:stop]], dtype=dtype, add_eos=True,
                num_threads=usable_cores()) for key in PAIR_KEYS)
        return
    pieces = [_pieces(start, stop, processes) for start, stop in parts]
    # Every text listed at once (pointers to the pairs' strings, 72 MB for WMT14's 9 M):
    # the pool's `map` submits every batch at once anyway.
    batches = [[p[key] for p in pairs[a:b]]
               for part in pieces for key in PAIR_KEYS for a, b in part]
    with contextlib.closing(encode_in_processes(tokenizer, batches, dtype=dtype, add_eos=True,
                                                processes=processes)) as encoded:
        for part in pieces:
            sides = [[next(encoded) for _ in part] for _ in PAIR_KEYS]
            yield _part_arrays(tuple(map(np.concatenate, zip(*side))) for side in sides)


def _pieces(start: int, stop: int, count: int) -> list[tuple[int, int]]:
    """[start, stop) cut into `count` ranges whose sizes differ by one at most (fewer, none
    empty, when there are fewer than `count` items)."""
    bounds = [start + (stop - start) * i // count for i in range(count + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]


def _part_arrays(sides) -> dict[str, np.ndarray]:
    """A part's arrays from each side's (lengths, ids), sources first."""
    arrays = {}
    for side, (lengths, ids) in zip(SIDES, sides):
        arrays[side], arrays[f"{side}_lengths"] = ids, lengths
    return arrays


def _write_part(path: str, arrays: dict[str, np.ndarray]) -> None:
    """One part: each side's ids end to end and their lengths; whole or not at all."""
    with atomic_write(path) as f:
        np.savez(f, **arrays)


def _part_damage(path: str, num_pairs: int, dtype) -> str | None:
    """Why the part at `path` is not `num_pairs` pairs of `dtype` ids (None: it is whole).
    Reads every byte, so the zip's CRC-32 of each array is checked."""
    try:
        with np.load(path) as part:
            arrays = {name: part[name] for name in part.files}
        lengths = {side: arrays[f"{side}_lengths"] for side in SIDES}
        ids = {side: arrays[side] for side in SIDES}
    except Exception as error:  # noqa: BLE001 -- numpy and zipfile raise many kinds; any is damage
        return f"{type(error).__name__}: {error}"
    for side in SIDES:
        if (lengths[side].shape != (num_pairs,) or ids[side].dtype != dtype
                or ids[side].shape != (int(lengths[side].sum()),)):
            return f"its {side} are not {num_pairs:,} pairs of {np.dtype(dtype).name} ids"
    return None


def _join_parts(partial: str, num_parts: int, dtype) -> dict[str, int]:
    """Each side's parts into one ids array and one offsets array; the token counts."""
    tokens, paths = {}, [_part_path(partial, k) for k in range(num_parts)]
    for side in SIDES:
        lengths = [_part_array(path, f"{side}_lengths") for path in paths]
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths or [[]]))]).astype(np.int64)
        with atomic_write(os.path.join(partial, f"{side}_offsets.npy")) as f:
            np.save(f, offsets)
        with atomic_write(os.path.join(partial, f"{side}.npy")) as f:  # one part at a time
            np.lib.format.write_array_header_1_0(f, {
                "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                "fortran_order": False, "shape": (int(offsets[-1]),)})
            for path in paths:
                f.write(np.ascontiguousarray(_part_array(path, side), dtype).tobytes())
        tokens[side] = int(offsets[-1])
    return tokens


def _part_array(path: str, name: str) -> np.ndarray:
    with np.load(path) as part:
        return part[name]


def _move_into_place(partial: str, folder: str) -> None:
    """Removes the parts and made_from.json (the manifest records it), then renames
    `partial` to `folder`, on disk."""
    for name in os.listdir(partial):
        if name.startswith("part-") or name == MADE_FROM:
            os.unlink(os.path.join(partial, name))
    sync_folder(partial)
    try:
        os.rename(partial, folder)
    except OSError:  # another process prepared it first: theirs and ours are the same
        if not os.path.exists(os.path.join(folder, MANIFEST)):
            raise
        shutil.rmtree(partial, ignore_errors=True)
    sync_folder(os.path.dirname(folder))


def _write_json(path: str, value) -> None:
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
