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

Preparing is idempotent, resumable and refuses stale data:
- A split is written into `{split}.partial/` in parts of `PART_PAIRS` pairs, each
  renamed into place when whole; a rerun after a kill keeps the whole parts and
  redoes the rest. The split's folder is renamed into place last, so a split
  folder is always complete; nothing else is ever read.
- The manifest records what the ids were made from: the tokenizer (its SHA-256),
  the dataset, languages and source files (`sources.describe_split`). Opening a
  split whose record differs from the config's is a DataError naming the
  difference, never a silent reuse.
- In a multi-host run, process 0 prepares and the others wait, then open.
"""

import hashlib
import itertools
import json
import os
import shutil
import time
import uuid

import numpy as np
import tqdm

from transformer_jax.data.sources import DataError, describe_split, load_split
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.vocabulary import get_tokenizer, tokenizer_path

PREPARED_DIR = "prepared"
# The splits read as ids: training batches and the validation loss. The test split is
# only translated and scored, from its text (evaluate.py).
PREPARED_SPLITS = ("train", "validation")
SIDES = ("inputs", "targets")
PART_PAIRS = 250_000  # pairs per part: the work a kill can lose
FORMAT_VERSION = 1


def prepared_dir(workdir: str) -> str:
    """Where a run's prepared splits live."""
    return os.path.join(workdir, PREPARED_DIR)


def made_from(data_config, split: str, tokenizer: Tokenizer) -> dict:
    """What the ids of `split` depend on: the manifest's record, compared on every open."""
    return {"format": FORMAT_VERSION,
            "tokenizer_sha256": hashlib.sha256(tokenizer.model_proto).hexdigest(),
            **describe_split(data_config, split)}


class PreparedSplit:
    """One prepared split, read by memory map: a grain random-access data source.

    `split[i]` is {"inputs": ids, "targets": ids} (int32, EOS included); `lengths(side)`
    is every pair's length on one side, the index packing plans with. Pickles as its
    folder, so grain workers open their own maps.
    """

    def __init__(self, folder: str):
        self.folder = folder
        with open(os.path.join(folder, "manifest.json")) as f:
            self.manifest = json.load(f)
        self._ids, self._offsets, self._lengths = {}, {}, {}
        for side in SIDES:  # plain arrays over the maps: np.memmap's indexing is slower
            self._ids[side] = np.asarray(np.load(os.path.join(folder, f"{side}.npy"),
                                                 mmap_mode="r"))
            self._offsets[side] = np.asarray(np.load(os.path.join(folder, f"{side}_offsets.npy"),
                                                     mmap_mode="r"))

    def __reduce__(self):
        return (PreparedSplit, (self.folder,))

    def __len__(self) -> int:
        return self.manifest["pairs"]

    def __getitem__(self, i) -> dict[str, np.ndarray]:
        i = range(len(self))[i]  # negative indices; IndexError past the end
        return {side: np.asarray(self._ids[side][o[i]:o[i + 1]], np.int32)
                for side, o in self._offsets.items()}

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


def open_split(data_config, workdir: str, split: str, tokenizer: Tokenizer) -> PreparedSplit:
    """The prepared `split` of `workdir`; DataError if it is missing or stale."""
    folder = os.path.join(prepared_dir(workdir), split)
    if not os.path.exists(os.path.join(folder, "manifest.json")):
        raise DataError(f"{split} is not prepared in {prepared_dir(workdir)}: run python -m "
                        f"transformer_jax.data prepare --config=... --workdir={workdir}")
    prepared = PreparedSplit(folder)
    _refuse_stale(prepared.manifest["made_from"], made_from(data_config, split, tokenizer),
                  folder)
    return prepared


def _refuse_stale(recorded: dict, wanted: dict, folder: str) -> None:
    changed = sorted(k for k in recorded.keys() | wanted.keys() if recorded.get(k) != wanted.get(k))
    if changed:
        diffs = "; ".join(f"{k}: prepared from {recorded.get(k)!r}, now {wanted.get(k)!r}"
                          for k in changed)
        raise DataError(f"{folder} is stale ({diffs}). Its ids no longer match the config; "
                        f"delete {folder} to prepare it again (a run's checkpoints were "
                        f"trained on the old ids), or use another workdir.")


def prepare(data_config, workdir: str, *, splits=PREPARED_SPLITS,
            log=print) -> tuple[Tokenizer, dict[str, PreparedSplit]]:
    """Trains or loads the run's tokenizer, then tokenizes each of `splits` not yet prepared.

    Returns the tokenizer and the prepared splits; a stale one is a DataError.
    `log` gets one line per split with its size and rate.
    """
    folders = {split: os.path.join(prepared_dir(workdir), split) for split in splits}
    missing = [s for s in splits if not os.path.exists(os.path.join(folders[s], "manifest.json"))]
    # The training split is read only if something needs it: a resume reads no text.
    needs_train = "train" in missing or not os.path.exists(tokenizer_path(workdir))
    train = load_split(data_config, "train") if needs_train else None
    tokenizer = get_tokenizer(data_config, workdir, train.pairs if train else None)
    for split in missing:
        pairs = train if split == "train" else load_split(data_config, split)
        _write_split(pairs, made_from(data_config, split, tokenizer), tokenizer, folders[split],
                     log)
    return tokenizer, {split: open_split(data_config, workdir, split, tokenizer)
                       for split in splits}


def _write_split(split, record: dict, tokenizer: Tokenizer, folder: str, log) -> None:
    """Tokenizes `split` (a sources.Split) into `folder`, through `folder`.partial."""
    partial = folder + ".partial"
    started = _start_partial(partial, record)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    pairs, cores = split.pairs, os.cpu_count() or 1
    parts = range(0, len(pairs), PART_PAIRS)
    with tqdm.tqdm(total=len(pairs), desc=f"preparing {split.name}", unit="pair",
                   disable=len(pairs) < 50_000) as progress:
        for k, start in enumerate(parts):
            path = os.path.join(partial, f"part-{k:05d}.npz")
            chunk = pairs[start:start + PART_PAIRS]
            if not os.path.exists(path):
                _write_part(path, chunk, tokenizer, dtype, cores)
            progress.update(len(chunk))
    tokens = _join_parts(partial, len(parts), dtype)
    manifest = {"made_from": record, "pairs": len(pairs), "skipped_empty": split.skipped_empty,
                "dtype": np.dtype(dtype).name, "tokens": tokens}
    _write_json(os.path.join(partial, "manifest.json"), manifest)
    for k in range(len(parts)):
        os.unlink(os.path.join(partial, f"part-{k:05d}.npz"))
    os.unlink(os.path.join(partial, "made_from.json"))  # the manifest records it
    try:
        os.rename(partial, folder)
    except OSError:  # another process prepared it first: theirs and ours are the same
        if not os.path.exists(os.path.join(folder, "manifest.json")):
            raise
        shutil.rmtree(partial, ignore_errors=True)
    seconds = time.perf_counter() - started
    log(f"prepared {split.name}: {len(pairs):,} pairs, {sum(tokens.values()):,} tokens in "
        f"{seconds:.1f} s ({len(pairs) / max(seconds, 1e-9):,.0f} pairs/s on {cores} cores)")


def _start_partial(partial: str, record: dict) -> float:
    """Keeps the whole parts of an earlier attempt made from `record`; else starts afresh."""
    record_path = os.path.join(partial, "made_from.json")
    try:
        with open(record_path) as f:
            reusable = json.load(f) == record
    except (OSError, ValueError):
        reusable = False
    if not reusable:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        _write_json(record_path, record)
    for name in os.listdir(partial):  # writes a kill cut short: never renamed into place
        if ".tmp-" in name:
            os.unlink(os.path.join(partial, name))
    return time.perf_counter()


def _write_part(path: str, pairs: list, tokenizer: Tokenizer, dtype, threads: int) -> None:
    """One part: each side's ids end to end and their lengths; renamed into place when whole."""
    arrays = {}
    for side, key in zip(SIDES, ("source", "target")):
        ids = tokenizer.encode_batch([p[key] for p in pairs], add_eos=True, num_threads=threads)
        arrays[f"{side}_lengths"] = np.fromiter(map(len, ids), np.int64, len(ids))
        arrays[side] = np.fromiter(itertools.chain.from_iterable(ids), dtype,
                                   int(arrays[f"{side}_lengths"].sum()))
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def _join_parts(partial: str, num_parts: int, dtype) -> dict[str, int]:
    """Each side's parts into one ids array and one offsets array; the token counts."""
    tokens = {}
    for side in SIDES:
        lengths = [np.load(os.path.join(partial, f"part-{k:05d}.npz"))[f"{side}_lengths"]
                   for k in range(num_parts)]
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths or [[]]))]).astype(np.int64)
        np.save(os.path.join(partial, f"{side}_offsets.npy"), offsets)
        ids = np.lib.format.open_memmap(os.path.join(partial, f"{side}.npy"), mode="w+",
                                        dtype=dtype, shape=(int(offsets[-1]),))
        for k in range(num_parts):
            part = np.load(os.path.join(partial, f"part-{k:05d}.npz"))[side]
            start = offsets[sum(len(x) for x in lengths[:k])]
            ids[start:start + len(part)] = part
        ids.flush()
        del ids
        tokens[side] = int(offsets[-1])
    return tokens


def _write_json(path: str, value) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
