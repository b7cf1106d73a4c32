"""One prepared split on disk, and its reader: a grain random-access data source.

    {split}/inputs.npy           every pair's source ids (EOS included), end to end
    {split}/targets.npy          the same for the targets
    {split}/inputs_offsets.npy   (N + 1,) int64: pair i is inputs[o[i]:o[i + 1]]
    {split}/targets_offsets.npy
    {split}/manifest.json        what it was made from, its pairs, tokens and dtype; written last

The format is NumPy's .npy, read with `np.load(mmap_mode="r")`, rather than
array_record: a batch's ids are one fancy-index gather from a contiguous array
(array_record deserializes record by record), the offsets are the index of
lengths that packing plans with, and the operating system's page cache shares
the files between grain's worker processes. This is the layout of fairseq's
and Megatron's indexed datasets. Ids are uint16 when the vocabulary fits (half
the disk and page cache of int32), else int32; readers get int32.

Opening checks that the manifest parses and that each array has the dtype and
length it says; `check` reads the offsets through (the ids carry no checksum:
every start would read them in full to check it). A failure is a
DamagedFileError naming the file.
"""

import json
import os

import numpy as np

from transformer_jax.data.sources import DataError

SIDES = ("inputs", "targets")
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class DamagedFileError(DataError):
    """A prepared file that does not hold what it should: `path` names it, `why` says how."""

    def __init__(self, path: str, why: str, advice: str = ""):
        super().__init__(f"{path} is damaged ({why}){advice}")
        self.path, self.why = path, why


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
