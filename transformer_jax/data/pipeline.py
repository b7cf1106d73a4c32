"""Prepared token ids to batches, with grain: cut or drop, shuffle, pack.

Training batches are packed: several pairs share each fixed-length row, told
apart by segment ids (1, 2, ...; 0 is padding) and positions that restart at 0
in every segment, the keys `Transformer.__call__` takes:

    inputs, inputs_segmentation, inputs_positions      (B, max_source_length)
    targets, targets_segmentation, targets_positions   (B, max_target_length)

A batch of B rows holds at most B * max_target_length target tokens: the
paper's token budget (§5.1, about 25k per step) is a choice of B and length,
`budget_rows`. Bucketing (bucketing.py) is the other way to batch: pairs of
similar length, padded.

Evaluation batches are padded, never packed, and hold every example once:
`example_mask` is False on the rows that only pad the last batch.
"""

import math
import signal
import sys

import grain
import numpy as np
from absl import flags

from transformer_jax.data.packing import PackedBatchIterDataset
from transformer_jax.data.sources import DataError
from transformer_jax.run_config import TOO_LONG
from transformer_jax.token_ids import PAD_ID

CHUNK = 1024  # example indices per grain element: grain's cost is per element, not per pair


class ShuffledChunks:
    """Chunk k of an endless stream of `indices`, shuffled anew each epoch: a grain
    random-access source (chunks may span two epochs).

    Written here because grain's `MapDataset.shuffle` permutes one index per call
    (about 28 us per pair on a 2-core CPU, as much as packing it); an epoch's order
    here is one NumPy permutation, seeded by (seed, epoch), kept for its chunks.
    """

    def __init__(self, indices: np.ndarray, seed: int | tuple[int, ...], chunk: int = CHUNK):
        self._indices, self._chunk = indices, chunk
        self._seed = (seed,) if isinstance(seed, int) else tuple(seed)
        self._epoch, self._order = -1, None

    def __len__(self) -> int:
        return sys.maxsize // self._chunk  # endless; grain wants a length

    def __getitem__(self, k: int) -> np.ndarray:
        n, parts, done = len(self._indices), [], 0
        while done < self._chunk:
            epoch, at = divmod(k * self._chunk + done, n)
            part = self._epoch_order(epoch)[at:at + self._chunk - done]
            parts.append(part)
            done += len(part)
        return np.concatenate(parts)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([*self._seed, epoch])
            self._epoch, self._order = epoch, self._indices[rng.permutation(len(self._indices))]
        return self._order


def budget_rows(tokens_per_batch: int, length: int, multiple: int = 1) -> int:
    """The most rows of `length` tokens within `tokens_per_batch` tokens, a multiple of
    `multiple` (devices x micro-batches); 0 when not even `multiple` rows fit.

    §5.1's budget is about 25,000 source and 25,000 target tokens per update: rows
    of `length` tokens on each side hold at most rows x length of each.
    """
    return tokens_per_batch // length // multiple * multiple


def train_dataset(source, *, batch_size: int, max_source_length: int, max_target_length: int,
                  too_long: str = "truncate", seed: int = 0, num_workers: int = 0,
                  shard_index: int = 0, shard_count: int = 1) -> grain.IterDataset:
    """Endless packed training batches from the pairs `shard_index::shard_count` of
    `source` (a prepared split: `prepared.PreparedSplit`).

    Each epoch is shuffled anew; the order is fixed by `seed`. Pairs longer than a
    row are cut (`too_long="truncate"`; a cut target loses its EOS, so the model is
    not taught to stop there) or left out ("drop"). With `num_workers` > 0, grain
    worker processes pack (`mp_prefetch`), each a slice of the chunks, and the
    batches come from them in turn: the same batches for the same worker count.
    `iter(...)` gives an iterator whose `get_state()` / `set_state()` resume exactly.
    """
    indices = usable_pairs(source, np.arange(shard_index, len(source), shard_count),
                           too_long=too_long, max_source_length=max_source_length,
                           max_target_length=max_target_length)
    chunks = grain.MapDataset.source(ShuffledChunks(indices, seed)).to_iter_dataset(
        grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
    batches = PackedBatchIterDataset(
        chunks, source, batch_size=batch_size,
        lengths={"inputs": max_source_length, "targets": max_target_length})
    return in_workers(batches, num_workers)


def usable_pairs(source, indices: np.ndarray, *, too_long: str, max_source_length: int,
                 max_target_length: int) -> np.ndarray:
    """`indices` less the pairs longer than a row when `too_long` is "drop"; a DataError
    when none is left."""
    if too_long not in TOO_LONG:
        raise ValueError(f"too_long must be one of {TOO_LONG}, got {too_long!r}")
    if not len(indices):
        raise DataError("no training pairs: the training split is empty")
    if too_long == "drop":
        fits = ((source.lengths("inputs")[indices] <= max_source_length)
                & (source.lengths("targets")[indices] <= max_target_length))
        if not fits.any():
            raise DataError(f"all {len(indices)} training pairs were dropped: none fits the "
                            f"rows ({max_source_length} + {max_target_length} tokens); cut them "
                            f"instead (too_long='truncate') or make the rows longer")
        indices = indices[fits]
    return indices


def in_workers(batches: grain.IterDataset, num_workers: int) -> grain.IterDataset:
    """`batches` made by `num_workers` grain worker processes (`mp_prefetch`); 0: as is.

    Each batch's arrays come back through shared memory, grain's default. Copied through
    the workers' pipes instead (grain's `min_shm_size` of 1 MiB), batches came 1.2-3.0 x
    faster on 2 cores, but closing could wait 25 s: a worker that put one more batch after
    grain's close emptied its queue waited at exit for a reader that never came, until
    grain killed it (4 of 6 runs of train.py, 5 steps with 2 workers). Either way workers
    deliver more target tokens than a step takes on an H200 (BENCHMARKS.md, "pipeline:
    prepared ids to batches").
    """
    if num_workers == 0:
        return batches
    if not flags.FLAGS.is_parsed():  # grain 0.2.18's workers read an absl flag: defaults do
        flags.FLAGS.mark_as_parsed()
    return batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers,
                                                            per_worker_buffer_size=4),
                               worker_init_fn=_ignore_stop_signals)


def _ignore_stop_signals(worker_index: int, worker_count: int) -> None:
    """In each worker: ignore SIGINT and SIGTERM, which reach the whole process group (Ctrl-C
    in a terminal, a scheduler's preemption). The training process answers them: it saves,
    then closes its workers (grain sets their stop event, then kills). A worker that died
    of the signal printed a KeyboardInterrupt traceback, or, killed while writing a batch,
    left grain's close waiting forever on the half-written batch."""
    del worker_index, worker_count
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def padded_rows(source, side: str, indices: np.ndarray, rows: int, length: int) -> np.ndarray:
    """(rows, length) int32: pair `indices[k]`'s ids on `side` in row k, cut to `length`,
    then PAD_ID; the rows past `len(indices)` are all padding."""
    size = np.minimum(source.lengths(side)[indices], length)
    array = np.full((rows, length), PAD_ID, np.int32)
    array[:len(indices)][np.arange(length) < size[:, None]] = source.gather(side, indices, size)
    return array


def eval_batches(source, *, batch_size: int, max_source_length: int, max_target_length: int,
                 shard_index: int = 0, shard_count: int = 1):
    """Padded batches holding every pair of `source` (a prepared split) exactly once.

    Every process gets the same number of batches (some may be all padding), so
    collective evaluation steps line up. Too-long pairs are cut, never dropped.
    Each batch has `inputs`, `targets`, `example_mask` (False on padding rows) and
    `index` (the pair's position in `source`, -1 on padding rows).
    """
    mine = np.arange(shard_index, len(source), shard_count)
    num_batches = math.ceil(math.ceil(len(source) / shard_count) / batch_size)
    for b in range(num_batches):
        indices = mine[b * batch_size:(b + 1) * batch_size]
        batch = {"example_mask": np.arange(batch_size) < len(indices),
                 "index": np.full((batch_size,), -1, np.int32)}
        batch["index"][:len(indices)] = indices
        batch["inputs"] = padded_rows(source, "inputs", indices, batch_size, max_source_length)
        batch["targets"] = padded_rows(source, "targets", indices, batch_size, max_target_length)
        yield batch
