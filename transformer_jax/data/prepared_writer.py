"""Writing one prepared split: tokenized in parts, resumable after a kill, then joined.

    write_split(split, record, tokenizer, folder, log=print, processes=None)

Every file is written whole or not at all (`atomic_file`: a temporary name, fsync,
rename). A split is written into `{folder}.partial/` in parts of `PART_PAIRS` pairs;
a rerun after a kill keeps the whole parts and redoes the rest. A part left by an
earlier attempt is read whole first (its zip CRC-32s, its pairs' count and dtype); a
damaged one (a power cut before it reached the disk, a disk error) is tokenized
again with a one-line warning: parts are only ever derived data. The parts are then
joined into the arrays of `prepared_split.py`, the manifest is written last, and the
folder is renamed into place, so a split folder is always complete.

A large split is tokenized by worker processes (parallel_encoding.py), each part's
sides cut into a piece per process; a small one by sentencepiece's threads in this
process (`worker_processes` decides).
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
from transformer_jax.data.prepared_split import MANIFEST, SIDES, DamagedFileError, PreparedSplit
from transformer_jax.data.tokenizer import Tokenizer

PAIR_KEYS = ("source", "target")  # the text of each of SIDES in a pair
PART_PAIRS = 250_000  # pairs per part: the work a kill can lose
# Splits this large are tokenized by worker processes (parallel_encoding.py) unless
# `processes` says otherwise. Below it they save little: on 2 cores the numbers
# dataset's 200,000 short pairs took 1.5-1.6 s in 2 processes against 1.8 s in threads
# (BENCHMARKS.md, "pipeline: tokenizing in worker processes"), and they stay in process.
PROCESS_MIN_PAIRS = 250_000
# At most this many by default, however many cores: each holds its batch's texts and ids
# (about 300 MB at 125,000 WMT-like sentences), and the calling process's own share
# (sending texts, joining arrays: 4 % of the work on 2 cores) leaves little to gain
# beyond it.
MAX_PROCESSES = 32
MADE_FROM = "made_from.json"  # in {split}.partial/ while its parts are written


def worker_processes(pairs: int, processes: int | None = None) -> int:
    """How many worker processes tokenize `pairs` pairs, for `prepare(processes=...)`:
    0 means none (sentencepiece's threads in this process), and so does 1."""
    if processes is None:
        processes = min(usable_cores(), MAX_PROCESSES) if pairs >= PROCESS_MIN_PAIRS else 0
    return processes if processes > 1 else 0  # one would only wait for the other


def write_split(split, record: dict, tokenizer: Tokenizer, folder: str, log=print,
                processes: int | None = None) -> None:
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
        write_json(os.path.join(partial, MANIFEST), manifest)
    _move_into_place(partial, folder)
    seconds, pairs = time.perf_counter() - started, len(split.pairs)
    skipped = (f"; {split.skipped_empty:,} skipped (an empty side)" if split.skipped_empty
               else "")
    if not pairs:
        return log(f"prepared {split.name}: no pairs, the split is empty{skipped}")
    how = ("nothing left to tokenize" if workers is None else
           f"{workers} worker processes" if workers else f"{usable_cores()} threads")
    log(f"prepared {split.name}: {pairs:,} pairs, {sum(manifest['tokens'].values()):,} tokens "
        f"in {seconds:.1f} s ({pairs / max(seconds, 1e-9):,.0f} pairs/s, {how}){skipped}")


def _start_partial(partial: str, record: dict) -> float:
    """Keeps the whole files of an earlier attempt made from `record`; else starts afresh."""
    if _partial_record(partial) == record:
        remove_temporaries(partial)  # writes a kill cut short: never renamed into place
    else:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        write_json(os.path.join(partial, MADE_FROM), record)
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


def write_json(path: str, value) -> None:
    """`value` as JSON at `path`, whole or not at all."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
