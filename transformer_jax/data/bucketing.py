"""Batches of pairs of similar length, each within a token budget: bucketing (§5.1).

"Sentence pairs were batched together by approximate sequence length. Each training
batch contained a set of sentence pairs containing approximately 25000 source tokens
and 25000 target tokens." Packing (packing.py) is the other way to spend that budget;
this is the paper's.

A pair's length is the longer of its two sides, cut to the rows. The whole split's
lengths are cut into at most `num_buckets` buckets (so a run compiles a few shapes),
multiples of 8 chosen to pad least; a bucket too small for one batch in every
process joins the next longer one. A batch holds pairs of one
bucket, padded to the bucket's length L on each side (never beyond the side's row
length), in as many rows as the budget allows: rows x L <= tokens_per_batch
(`pipeline.budget_rows`), or a fixed number of rows.

The bucket of batch k is a pure function of (seed, k), the same in every process
(every process knows every pair's length), so the processes' batches of one step
have one shape; each process fills them from its own shard of the bucket. Each
round of the schedule holds every bucket as often as its pairs fill batches, in
an order shuffled anew each round; each bucket's pairs are shuffled anew each
time they are all used. So batch k is random access, and grain's own iterator
state (the next k) resumes it exactly, with or without worker processes.

A batch is padded like an evaluation batch: {"inputs": (rows, Ls), "targets": (rows,
Lt)}, PAD_ID after each pair's ids; the model reads padding from the ids.
"""

import bisect
import math
import sys
from collections.abc import Callable

import grain
import numpy as np

from transformer_jax.data.pipeline import (
    ShuffledChunks,
    budget_rows,
    in_workers,
    padded_rows,
    usable_pairs,
)
from transformer_jax.data.sources import DataError

ROUND_TO = 8  # bucket lengths are multiples of this (the last may be the row length)


def bucket_lengths(pair_lengths: np.ndarray, num_buckets: int, longest: int) -> list[int]:
    """At most `num_buckets` bucket lengths, ascending, that pad `pair_lengths` least: each a
    multiple of ROUND_TO or `longest`, the last holding the longest pair.

    A dynamic program over the lengths' histogram: best[b][j] is the fewest row slots
    (pairs x their bucket's length) that hold the pairs up to candidate length j in
    b + 1 buckets, the last of length j. Written here: tf.data's
    bucket_by_sequence_length and tensor2tensor take the lengths as given (t2t: a
    geometric series, which wastes most where pairs are fewest).
    """
    candidates = sorted({*range(ROUND_TO, longest, ROUND_TO), longest})
    candidates = candidates[:bisect.bisect_left(candidates, int(pair_lengths.max())) + 1]
    counts = np.bincount(np.searchsorted(candidates, pair_lengths), minlength=len(candidates))
    upto = np.concatenate([[0], np.cumsum(counts)]).tolist()  # pairs before candidate j
    slots = lambda i, j: candidates[j] * (upto[j + 1] - upto[i])  # noqa: E731 i..j in one
    last = len(candidates) - 1
    best = [[slots(0, j) for j in range(last + 1)]]  # best[b][j]: in b + 1 buckets
    cut = [[-1] * (last + 1)]  # the candidate that ends the bucket before j's
    for b in range(1, min(num_buckets, last + 1)):
        best.append([math.inf] * (last + 1))
        cut.append([-1] * (last + 1))
        for j in range(b, last + 1):
            for i in range(b - 1, j):
                if best[b - 1][i] + slots(i + 1, j) < best[b][j]:
                    best[b][j], cut[b][j] = best[b - 1][i] + slots(i + 1, j), i
    b = min(range(len(best)), key=lambda b: (best[b][last], b))  # no bucket that saves nothing
    lengths, j = [], last
    while j >= 0:
        lengths.append(candidates[j])
        j, b = cut[b][j], b - 1
    return lengths[::-1]


class BucketedBatches:
    """Batch k of an endless stream of bucketed batches: a grain random-access source.

    `buckets[b]` is (rows, (source length, target length), the indices of this
    shard's pairs in bucket b); `rounds[b]` how often bucket b comes in one round of
    the schedule. Pickles with its source (a prepared split pickles as its folder).
    """

    def __init__(self, source, buckets: list[tuple[int, tuple[int, int], np.ndarray]],
                 rounds: list[int], seed: int):
        self._source, self._seed = source, seed
        self._shapes = [(rows, lengths) for rows, lengths, _ in buckets]
        self._pairs = [ShuffledChunks(indices, (seed, b), chunk=rows)
                       for b, (rows, _, indices) in enumerate(buckets)]
        self._rounds = np.asarray(rounds)
        self._round, self._order, self._rank = -1, None, None

    def __len__(self) -> int:
        return sys.maxsize  # endless; grain wants a length

    def __getitem__(self, k: int) -> dict[str, np.ndarray]:
        bucket, j = self.batch_of_bucket(k)
        rows, (source_length, target_length) = self._shapes[bucket]
        indices = self._pairs[bucket][j]
        return {"inputs": padded_rows(self._source, "inputs", indices, rows, source_length),
                "targets": padded_rows(self._source, "targets", indices, rows, target_length)}

    def batch_of_bucket(self, k: int) -> tuple[int, int]:
        """(b, j): batch k is batch j of bucket b's pairs."""
        round_, at = divmod(k, int(self._rounds.sum()))
        if round_ != self._round:
            rng = np.random.default_rng([self._seed, round_])
            order = rng.permutation(np.repeat(np.arange(len(self._rounds)), self._rounds))
            rank = np.empty_like(order)  # how many batches of its bucket come before it
            for b in range(len(self._rounds)):
                rank[order == b] = np.arange(self._rounds[b])
            self._round, self._order, self._rank = round_, order, rank
        bucket = int(self._order[at])
        return bucket, round_ * int(self._rounds[bucket]) + int(self._rank[at])


def bucketed_dataset(source, *, max_source_length: int, max_target_length: int,
                     tokens_per_batch: int = 0, batch_size: int = 0, rows_multiple: int = 1,
                     num_buckets: int = 8, too_long: str = "truncate", seed: int = 0,
                     num_workers: int = 0, shard_index: int = 0, shard_count: int = 1,
                     log: Callable[[str], None] | None = None) -> grain.IterDataset:
    """Endless bucketed training batches from this shard of `source` (a prepared split).

    Each batch holds `tokens_per_batch` tokens at most on each side (this process's
    share of the update's budget), in rows a multiple of `rows_multiple`; or, with
    `tokens_per_batch` 0, `batch_size` rows. `too_long`, `seed`, `num_workers` and the
    shard are as in `pipeline.train_dataset`; the batches do not depend on
    `num_workers`. `log` gets one line naming the buckets.
    """
    if bool(tokens_per_batch) == bool(batch_size):
        raise ValueError("give one of tokens_per_batch and batch_size")
    longest = max(max_source_length, max_target_length)

    def rows_of(length: int) -> int:
        return budget_rows(tokens_per_batch, length, rows_multiple) if tokens_per_batch \
            else batch_size

    if rows_of(longest) == 0:
        raise DataError(f"a budget of {tokens_per_batch} tokens holds no {rows_multiple} rows "
                        f"of {longest} tokens")
    indices = usable_pairs(source, np.arange(len(source)), too_long=too_long,
                           max_source_length=max_source_length,
                           max_target_length=max_target_length)
    pair_lengths = np.maximum(np.minimum(source.lengths("inputs")[indices], max_source_length),
                              np.minimum(source.lengths("targets")[indices], max_target_length))
    lengths = _joined(bucket_lengths(pair_lengths, num_buckets, longest), np.sort(pair_lengths),
                      lambda length: shard_count * rows_of(length))
    which = np.searchsorted(lengths, pair_lengths)  # the first bucket that holds the pair
    buckets, rounds = [], []
    for b, length in enumerate(lengths):  # each process takes every shard_count-th pair
        rows, members = rows_of(length), indices[which == b]
        mine = members[shard_index::shard_count]
        if not len(mine):
            raise DataError(f"too few training pairs ({len(indices)}) for {shard_count} "
                            f"processes")
        buckets.append((rows, (min(length, max_source_length), min(length, max_target_length)),
                        mine))
        rounds.append(max(1, len(members) // (shard_count * rows)))  # batches per epoch
    if log is not None:
        log(f"bucketed batches: {len(lengths)} buckets, rows x length "
            + ", ".join(f"{rows} x {max(shape)}" for rows, shape, _ in buckets))
    batches = grain.MapDataset.source(BucketedBatches(source, buckets, rounds, seed))
    return in_workers(batches.to_iter_dataset(grain.ReadOptions(num_threads=1,
                                                                prefetch_buffer_size=2)),
                      num_workers)


def _joined(lengths: list[int], sorted_pair_lengths: np.ndarray,
            needs: Callable[[int], int]) -> list[int]:
    """`lengths` less those whose bucket has fewer pairs than `needs(length)` (one batch in
    every process): their pairs join the next longer bucket, and the longest bucket
    grows to hold the last ones."""
    kept, counted = [], 0
    for length in lengths:
        upto = int(np.searchsorted(sorted_pair_lengths, length, side="right"))
        if upto - counted >= needs(length):
            kept.append(length)
            counted = upto
    if counted < len(sorted_pair_lengths):  # the longest pairs joined no bucket
        kept[-1:] = [lengths[-1]]
    return kept
