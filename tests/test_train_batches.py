"""train_batches: the rows of an update from the token budget, the seed of a new shuffle."""

import jax
import numpy as np
import pytest

from run_configs import tiny_run
from transformer_jax.config_checks import ConfigError
from transformer_jax.data.pipeline import ShuffledChunks
from transformer_jax.train_batches import (batch_rows, new_shuffle_seed, too_long_line,
                                           train_batches)

BUDGET = 25_000  # §5.1: about 25,000 source and 25,000 target tokens per batch


@pytest.mark.parametrize("devices, accumulation, processes, rows", [
    (8, 1, 1, 96),   # the paper's 8 GPUs: 12 rows of 256 tokens each
    (1, 1, 1, 97),   # one GPU takes the whole update
    (1, 4, 1, 96),   # in 4 micro-batches of 24 rows
    (4, 1, 2, 48),   # 2 processes of 4 devices: 12,500 tokens each
])
def test_the_papers_budget_in_rows_of_256(devices, accumulation, processes, rows, monkeypatch):
    monkeypatch.setattr("jax.process_count", lambda: processes)
    config = tiny_run(per_device_batch_size=0, accumulation_steps=accumulation)
    config.data.update(tokens_per_batch=BUDGET, max_source_length=256, max_target_length=256)
    assert batch_rows(config, devices) == rows
    assert rows * 256 * processes <= BUDGET


def test_bucketed_batches_take_the_processes_share_of_the_budget(monkeypatch):
    """Bucketed batches in 2 processes: each builds its batches on half the tokens, with
    whole micro-batches on each of its 4 devices (each process spending the whole budget
    made the update twice §5.1's)."""
    from transformer_jax import train_batches as module

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(module, "too_long_line", lambda *args: None)
    built = {}
    monkeypatch.setattr(module, "bucketed_dataset",
                        lambda source, **kwargs: built.update(kwargs) or "batches")
    config = tiny_run(per_device_batch_size=0, accumulation_steps=2)
    config.data.update(batching="bucketed", tokens_per_batch=BUDGET)
    assert module.train_batches(config, None, 0, 4, seed=0, announce=False) == "batches"
    assert (built["tokens_per_batch"], built["rows_multiple"]) == (12_500, 8)
    assert (built["shard_index"], built["shard_count"]) == (0, 2)


def test_a_new_shuffle_does_not_replay_the_first_batches():
    """The seed of a resume without its data position is drawn from (seed, step): the
    first pairs it packs are neither those of the run's start nor of another step's."""
    def first_pairs(seed):
        return tuple(ShuffledChunks(np.arange(1000), seed, chunk=20)[0])

    assert new_shuffle_seed(0, 4) == new_shuffle_seed(0, 4)
    seeds = [0, new_shuffle_seed(0, 4), new_shuffle_seed(0, 6), new_shuffle_seed(1, 4)]
    assert len({first_pairs(seed) for seed in seeds}) == 4


def test_without_a_budget_the_rows_are_per_device():
    assert batch_rows(tiny_run(per_device_batch_size=3), 8) == 24


def test_a_budget_too_small_for_a_row_per_micro_batch_names_the_shares(monkeypatch):
    """8 devices x 4 micro-batches need 32 rows of 256 tokens: 8,192 per process; 2
    processes sharing 12,000 tokens have 6,000 each."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    config = tiny_run(per_device_batch_size=0, accumulation_steps=4)
    config.data.update(tokens_per_batch=12_000, max_source_length=256, max_target_length=100)
    with pytest.raises(ConfigError) as error:
        batch_rows(config, 8)
    assert str(error.value) == ("config.data.tokens_per_batch=12000 holds no 32 rows of 256 "
                                "tokens in each of 2 processes (8 devices × 4 micro-batches); "
                                "raise it")
    config.data.tokens_per_batch = 2 * 32 * 256
    assert batch_rows(config, 8) == 32
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    one = tiny_run(per_device_batch_size=0)
    one.data.update(tokens_per_batch=40, max_source_length=32, max_target_length=32)
    with pytest.raises(ConfigError) as error:
        batch_rows(one, 2)
    assert str(error.value) == ("config.data.tokens_per_batch=40 holds no 2 rows of 32 tokens "
                                "(2 devices × 1 micro-batch); raise it")


class _Lengths:
    """A prepared split's lengths alone (PreparedSplit.lengths)."""

    def __init__(self, inputs, targets):
        self._lengths = {"inputs": np.array(inputs), "targets": np.array(targets)}

    def lengths(self, side):
        return self._lengths[side]


def test_pairs_longer_than_a_row_are_counted_before_training():
    """Pairs dropped (or cut) for their length were never counted: a quarter of a corpus
    could go untrained without a word."""
    config = tiny_run()
    d = config.data
    S, T = d.max_source_length, d.max_target_length
    source = _Lengths([S, S + 1, 3, 2], [T, 2, T + 1, 2])  # the 2nd and 3rd are too long
    assert too_long_line(d, source) == (
        f"2 of 4 training pairs (50.0%) are longer than a row ({S} + {T} tokens): cut to fit "
        f"(config.data.too_long='truncate'; 'drop' leaves them out)")
    d.too_long = "drop"
    assert too_long_line(d, source).endswith("dropped (config.data.too_long='drop')")
    assert too_long_line(d, _Lengths([S, 2], [T, 2])) is None


class _Pairs(_Lengths):
    """A prepared split's reading interface: pair i's ids are 4 + i, on both sides."""

    def __len__(self):
        return len(self._lengths["inputs"])

    def gather(self, side, indices, counts):
        return np.repeat(4 + np.asarray(indices), counts).astype(np.int32)


@pytest.mark.parametrize("batching", ["packed", "bucketed"])
def test_the_batches_are_shuffled_by_the_seed_given_not_the_configs(batching):
    """A run resumed without its data position trains on a new shuffle (`new_shuffle_seed`):
    its batches are that seed's, not the first batches of config.seed again."""
    config = tiny_run(**{"data.batching": batching})
    source = _Pairs(np.arange(500) % 5 + 1, np.arange(500) % 7 + 1)

    def first_targets(seed):
        batches = iter(train_batches(config, source, 4, 1, seed, announce=False))
        return np.stack([next(batches)["targets"] for _ in range(3)])

    start, resumed = first_targets(config.seed), first_targets(new_shuffle_seed(config.seed, 4))
    assert start.shape == resumed.shape and not np.array_equal(start, resumed)
    np.testing.assert_array_equal(first_targets(config.seed), start)


def test_each_seed_and_step_draws_its_own_shuffle():
    """Runs of seeds 0..4 resumed at steps 0..4: 25 new shuffles, none another's (seed 1 at
    step 3 is not seed 0 at step 4)."""
    assert len({new_shuffle_seed(seed, step) for seed in range(5) for step in range(5)}) == 25


@pytest.mark.parametrize("batching", ["packed", "bucketed"])
def test_only_process_0_announces_the_batches(batching, monkeypatch, capsys):
    """The line on pairs longer than a row (and bucketed batches' line) is printed once, by
    process 0, not once per process."""
    config = tiny_run(**{"data.batching": batching})
    source = _Pairs(np.arange(200) % 5 + 1, np.arange(200) % 30 + 1)  # some longer than 24
    said = {}
    for process in (0, 1):
        monkeypatch.setattr(jax, "process_index", lambda: process)
        next(iter(train_batches(config, source, 4, 1, 0)))
        said[process] = capsys.readouterr().out
    assert "training pairs (" in said[0] and said[1] == ""
    assert ("bucketed batches:" in said[0]) == (batching == "bucketed")


def test_accumulation_splits_the_rows_of_an_update_not_multiplies_them():
    """per_device_batch_size is the rows per device per update, micro-batches or not: 4
    rows on 8 devices in 2 micro-batches is 32 rows an update (2 rows a micro-batch)."""
    assert batch_rows(tiny_run(per_device_batch_size=4, accumulation_steps=2), 8) == 32
