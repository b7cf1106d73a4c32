"""Bucketed batches (§5.1): pairs of similar length within the paper's token budget.

Most tests read an in-memory source whose pair i is the id 3 + i repeated (its
length on each side), so every row says which pair it holds.
"""

import collections
import json

import numpy as np
import pytest
from run_configs import tiny_run
from test_data_pipeline import PAIRS, write_corpus

from transformer_jax.config_checks import ConfigError, check_config
from transformer_jax.data.bucketing import _joined, bucket_lengths, bucketed_dataset
from transformer_jax.data.pipeline import budget_rows
from transformer_jax.data.prepared import prepare
from transformer_jax.data.sources import DataError
from transformer_jax.token_ids import PAD_ID
from transformer_jax.trainer import train

BUDGET = 25_000  # §5.1: about 25,000 source and 25,000 target tokens per batch


class PairsOfLengths:
    """A prepared split's reading interface over lengths alone: pair i is 3 + i, repeated."""

    def __init__(self, source_lengths, target_lengths):
        self._lengths = {"inputs": np.asarray(source_lengths, np.int32),
                         "targets": np.asarray(target_lengths, np.int32)}

    def __len__(self):
        return len(self._lengths["inputs"])

    def lengths(self, side):
        return self._lengths[side]

    def gather(self, side, indices, counts):
        assert np.all(counts <= self._lengths[side][indices])
        return np.repeat(3 + np.asarray(indices), counts).astype(np.int32)


def wmt_like(pairs=20_000, seed=0):
    """Token lengths like WMT14 EN-DE's (about 30 +- 15 per side, up to a few hundred)."""
    rng = np.random.default_rng(seed)
    source = np.clip(rng.gamma(4.0, 7.5, pairs), 2, 400).astype(np.int32)
    target = np.clip(source * rng.normal(1.1, 0.15, pairs), 2, 400).astype(np.int32)
    return PairsOfLengths(source, target)


def pairs_of(batch):
    """The pair each row holds."""
    return batch["targets"][:, 0].astype(np.int64) - 3


def check_rows(batch, source):
    """Every row holds one pair's ids, cut to the row, then padding."""
    for side, rows in batch.items():
        for row in rows:
            pair = int(row[0]) - 3
            size = min(int(source.lengths(side)[pair]), rows.shape[1])
            expected = [3 + pair] * size + [PAD_ID] * (rows.shape[1] - size)
            np.testing.assert_array_equal(row, expected)


def take(dataset, n):
    iterator = iter(dataset)
    return [next(iterator) for _ in range(n)]


def test_bucket_lengths_pad_least():
    """10 pairs of 5 tokens, 10 of 20, 1 of 30; buckets are multiples of 8 up to 32. Row
    slots: one bucket 21 x 32 = 672; two, best [8, 32]: 80 + 11 x 32 = 432 (not [24, 32]:
    480 + 32 = 512); three, [8, 24, 32]: 80 + 240 + 32 = 352; a fourth saves nothing."""
    lengths = np.array([5] * 10 + [20] * 10 + [30])
    assert bucket_lengths(lengths, 1, longest=32) == [32]
    assert bucket_lengths(lengths, 2, longest=32) == [8, 32]
    assert bucket_lengths(lengths, 3, longest=32) == [8, 24, 32]
    assert bucket_lengths(lengths, 8, longest=32) == [8, 24, 32]
    # Not a multiple of 8: the row's length is the last; none beyond the longest pair.
    assert bucket_lengths(np.array([3, 28, 30]), 4, longest=30) == [8, 30]
    assert bucket_lengths(np.array([3, 4, 12]), 4, longest=256) == [8, 16]


def test_small_buckets_join_the_next_longer_one():
    lengths = np.sort(np.array([8] * 1 + [16] * 10 + [24] * 6 + [32] * 2))
    # Buckets of 8 (1 pair) and 32 (2 pairs) are too small for 5: 8's pairs join 16's,
    # and the longest pairs take the last kept bucket up to 32.
    assert _joined([8, 16, 24, 32], lengths, lambda length: 5) == [16, 32]
    assert _joined([8, 16, 24, 32], lengths, lambda length: 1) == [8, 16, 24, 32]
    assert _joined([8, 16, 24, 32], lengths, lambda length: 100) == [32]


def test_batches_keep_the_papers_budget_with_pairs_of_similar_length():
    """§5.1: each batch holds at most 25,000 source and 25,000 target tokens, as many rows as
    fit (a multiple of 8 devices), of pairs no longer than the bucket and longer than the
    bucket below."""
    source = wmt_like()
    lines = []
    batches = take(bucketed_dataset(source, tokens_per_batch=BUDGET, rows_multiple=8,
                                    max_source_length=256, max_target_length=256, seed=3,
                                    log=lines.append), 300)
    widths = sorted({b["targets"].shape[1] for b in batches})
    assert len(widths) == 8 and lines == [  # every bucket was drawn in 300 batches
        "bucketed batches: 8 buckets, rows x length "
        + ", ".join(f"{budget_rows(BUDGET, w, 8)} x {w}" for w in widths)]
    below = dict(zip(widths, [0] + widths[:-1]))
    real = collections.Counter()
    for batch in batches:
        rows, width = batch["targets"].shape
        assert batch["inputs"].shape == (rows, width) and width % 8 == 0
        assert rows % 8 == 0 and rows * width <= BUDGET < (rows + 8) * width
        pairs = pairs_of(batch)
        longer = np.maximum(source.lengths("inputs")[pairs], source.lengths("targets")[pairs])
        assert np.all(np.minimum(longer, 256) <= width) and np.all(longer > below[width])
        real["inputs"] += int(np.sum(batch["inputs"] != PAD_ID))
        real["targets"] += int(np.sum(batch["targets"] != PAD_ID))
    check_rows(batches[0], source)
    # Approximately 25,000 tokens: the longer side fills most of each bucket.
    assert 0.75 * BUDGET < real["targets"] / len(batches) <= BUDGET
    assert 0.6 * BUDGET < real["inputs"] / len(batches) < real["targets"] / len(batches)


def test_every_pair_once_per_bucket_epoch_then_reshuffled():
    source = wmt_like(pairs=3_000, seed=1)
    drawn = collections.defaultdict(list)
    for batch in take(bucketed_dataset(source, tokens_per_batch=4096, max_source_length=128,
                                       max_target_length=128, num_buckets=4), 120):
        drawn[batch["targets"].shape[1]].extend(pairs_of(batch).tolist())
    widths = sorted(drawn)
    longer = np.minimum(np.maximum(source.lengths("inputs"), source.lengths("targets")), 128)
    for width, low in zip(widths, [0] + widths[:-1]):
        members = set(np.flatnonzero((longer > low) & (longer <= width)).tolist())
        seen = drawn[width]
        assert len(seen) >= 2 * len(members), "each bucket should run through two epochs"
        first, second = seen[:len(members)], seen[len(members):2 * len(members)]
        assert set(first) == members and set(second) == members
        assert first != second  # shuffled anew


def test_processes_share_each_steps_shape_and_split_each_bucket():
    source = wmt_like(pairs=4_000, seed=2)
    args = dict(tokens_per_batch=2048, max_source_length=64, max_target_length=64, seed=5)
    shards = [take(bucketed_dataset(source, shard_index=i, shard_count=2, **args), 60)
              for i in range(2)]
    epoch = collections.defaultdict(lambda: [set(), set()])
    for k, (mine, theirs) in enumerate(zip(*shards)):
        assert mine["targets"].shape == theirs["targets"].shape, f"step {k}"
        assert mine["inputs"].shape == theirs["inputs"].shape
        for i, batch in enumerate((mine, theirs)):
            epoch[batch["targets"].shape[1]][i].update(pairs_of(batch).tolist())
    for width, (mine, theirs) in epoch.items():
        assert mine and theirs and not mine & theirs, width  # disjoint shards of the bucket


def test_fixed_rows_truncate_and_drop():
    source = PairsOfLengths([3, 5, 9, 30, 4] * 40, [4, 6, 8, 40, 3] * 40)
    for batch in take(bucketed_dataset(source, batch_size=16, max_source_length=16,
                                       max_target_length=16, num_buckets=2), 20):
        assert batch["targets"].shape[0] == 16
        check_rows(batch, source)  # pair 3's 30 + 40 tokens are cut to the rows
    dropped = take(bucketed_dataset(source, batch_size=16, max_source_length=16,
                                    max_target_length=16, too_long="drop"), 20)
    assert not any(np.any(pairs_of(b) % 5 == 3) for b in dropped)
    with pytest.raises(ValueError, match="one of tokens_per_batch and batch_size"):
        bucketed_dataset(source, batch_size=16, tokens_per_batch=100, max_source_length=16,
                         max_target_length=16)
    with pytest.raises(DataError, match="holds no 8 rows of 16 tokens"):
        bucketed_dataset(source, tokens_per_batch=100, rows_multiple=8, max_source_length=16,
                         max_target_length=16)


def test_resume_and_worker_processes_give_the_same_batches(tmp_path):
    """grain's iterator state resumes exactly, through JSON; 2 worker processes make the
    batches one process makes (batch k depends on k alone)."""
    _, splits = prepare(write_corpus(tmp_path / "corpus", {"train": PAIRS, "validation": PAIRS}),
                        str(tmp_path / "run"), log=lambda line: None)
    dataset = bucketed_dataset(splits["train"], tokens_per_batch=512, max_source_length=24,
                               max_target_length=20, seed=1)
    alone = iter(dataset)
    expected = [next(alone) for _ in range(5)]
    state = json.loads(json.dumps(alone.get_state()))
    expected += [next(alone) for _ in range(7)]
    resumed = iter(dataset)
    resumed.set_state(state)
    assert_same_batches([next(resumed) for _ in range(7)], expected[5:])
    workers = iter(bucketed_dataset(splits["train"], tokens_per_batch=512, max_source_length=24,
                                    max_target_length=20, seed=1, num_workers=2))
    try:
        assert_same_batches([next(workers) for _ in range(12)], expected)
    finally:
        workers.close()


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_run_trains_on_bucketed_batches_of_a_token_budget(tmp_path, capsys):
    """train.py's loop on bucketed batches in two shapes: it names the buckets, trains each
    step and saves the data iterator's position (the step in grain's state) with step 4.
    (Resuming from that state is exact: the resume test above.)"""
    config = tiny_run(num_train_steps=4, log_every_steps=1, checkpoint_every_steps=4,
                      num_eval_batches=0, per_device_batch_size=0,
                      **{"data.batching": "bucketed", "data.tokens_per_batch": 384,
                         "data.num_buckets": 2})
    records = train(config, str(tmp_path)).records
    assert "bucketed batches: 2 buckets, rows x length 48 x 8, 24 x 16" in capsys.readouterr().out
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    saved = list((tmp_path / "checkpoints" / "4" / "data_iterator").glob("process_*"))
    assert len(saved) == 1 and '"next_index": 4' in saved[0].read_text()


@pytest.mark.parametrize("overrides, message", [
    ({"data.batching": "sorted"}, "config.data.batching must be one of 'packed', 'bucketed'"),
    ({"data.tokens_per_batch": 25_000}, "both size the batch"),
    ({"per_device_batch_size": 0}, "per_device_batch_size must be a positive integer"),
    ({"per_device_batch_size": 0, "data.tokens_per_batch": 20},
     "tokens_per_batch=20 holds not one row"),
    ({"data.num_buckets": 0}, "config.data.num_buckets must be a positive integer"),
    ({"data.tokens_per_batch": -1}, "config.data.tokens_per_batch must be an integer >= 0"),
])
def test_batch_size_settings_are_checked(overrides, message):
    config = tiny_run(**overrides)
    with pytest.raises(ConfigError, match=message):
        check_config(config)


def test_no_bucket_is_longer_than_the_longest_pair():
    """A longest pair of exactly a multiple of 8 ends the buckets there: 16 (or 24) is the
    last length, not the next multiple of 8 above it, which would hold no pair."""
    assert bucket_lengths(np.array([3, 16]), 4, longest=32) == [8, 16]
    assert bucket_lengths(np.array([5] * 4 + [24]), 8, longest=64) == [8, 24]


def uneven_buckets():
    """7 pairs of 4 tokens (pairs 0..6) and 8 of 12 (pairs 7..14): in 2 processes of 2 rows,
    one batch of the first bucket per round (7 // 4) and two of the second (8 // 4)."""
    return PairsOfLengths([4] * 7 + [12] * 8, [4] * 7 + [12] * 8)


def test_every_round_holds_each_bucket_as_often_as_its_pairs_fill_batches_in_a_new_order():
    """Each round of 3 batches holds one of width 8 and two of width 16, the 8 where the
    round's own shuffle puts it: not in the same place round after round."""
    batches = take(bucketed_dataset(uneven_buckets(), batch_size=2, max_source_length=16,
                                    max_target_length=16, num_buckets=2, seed=0,
                                    shard_index=0, shard_count=2), 60)
    widths = [b["targets"].shape[1] for b in batches]
    rounds = [widths[k:k + 3] for k in range(0, 60, 3)]
    assert all(sorted(r) == [8, 16, 16] for r in rounds)
    assert len({r.index(8) for r in rounds}) > 1


def test_processes_draw_one_schedule_when_a_bucket_splits_unevenly():
    """The first bucket's 7 pairs split 4 and 3 between 2 processes: both draw its batch
    as often (from the bucket's pairs over both), so every step has one shape in both."""
    shards = [take(bucketed_dataset(uneven_buckets(), batch_size=2, max_source_length=16,
                                    max_target_length=16, num_buckets=2, seed=4,
                                    shard_index=k, shard_count=2), 40) for k in range(2)]
    for step, (mine, theirs) in enumerate(zip(*shards)):
        assert mine["targets"].shape == theirs["targets"].shape, step


def test_a_pairs_length_is_its_longer_side_cut_to_the_rows_and_no_side_pads_past_its_row():
    """Rows of 8 source and 32 target tokens: a pair of 20 + 5 tokens is 8 long (its source
    cut to 8), so its bucket is 8 wide on both sides; pairs of 3 + 14 tokens are in a bucket
    of 16, whose sources are padded to 8 at most."""
    for source, rows, width in ((PairsOfLengths([20] * 40, [5] * 40), 32, 8),
                                (PairsOfLengths([3] * 40, [14] * 40), 16, 16)):
        batches = take(bucketed_dataset(source, batch_size=4, max_source_length=8,
                                        max_target_length=rows), 5)
        for batch in batches:
            assert batch["inputs"].shape == (4, min(width, 8))
            assert batch["targets"].shape == (4, width)
            check_rows(batch, source)


def test_each_bucket_is_shuffled_on_its_own():
    """Two buckets of 8 pairs each (pairs 0..7 of 4 tokens, 8..15 of 12): the orders in
    which their pairs come are not one permutation drawn twice."""
    source = PairsOfLengths([4] * 8 + [12] * 8, [4] * 8 + [12] * 8)
    drawn = {8: [], 16: []}
    for batch in take(bucketed_dataset(source, batch_size=2, max_source_length=16,
                                       max_target_length=16, num_buckets=2, seed=2), 16):
        drawn[batch["targets"].shape[1]].extend(pairs_of(batch).tolist())
    first, second = drawn[8][:8], [pair - 8 for pair in drawn[16][:8]]
    assert sorted(first) == sorted(second) == list(range(8))
    assert first != second


def test_a_bucket_too_small_for_a_batch_in_every_process_joins_the_next():
    """5 pairs of 4 tokens fill a batch of 4 rows in one process but not in each of 2 (where
    one would hold 2 or 3 of them, each drawn again and again): they join the bucket of 16
    pairs of 12 tokens, whose 21 pairs each process takes every other one of."""
    source = PairsOfLengths([4] * 5 + [12] * 16, [4] * 5 + [12] * 16)
    for k in range(2):
        lines = []
        batches = take(bucketed_dataset(source, batch_size=4, max_source_length=16,
                                        max_target_length=16, num_buckets=2, shard_index=k,
                                        shard_count=2, log=lines.append), 10)
        assert lines == ["bucketed batches: 1 buckets, rows x length 4 x 16"]
        for batch in batches:
            assert batch["targets"].shape == (4, 16)
            assert all(pair % 2 == k for pair in pairs_of(batch).tolist())


def test_a_process_without_a_pair_of_a_bucket_is_a_data_error():
    """One pair and 2 processes: the second has none to train on, said when the batches
    are made (not a ZeroDivisionError at the first batch)."""
    with pytest.raises(DataError, match=r"^too few training pairs \(1\) for 2 processes$"):
        bucketed_dataset(PairsOfLengths([5], [5]), batch_size=2, max_source_length=8,
                         max_target_length=8, shard_index=1, shard_count=2)
