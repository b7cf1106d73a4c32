"""The training batches of a run: how many rows one update takes (§5.1's token budget
shared among processes and devices), packed or bucketed, this process's shard, and the
seed of a new shuffle when a resumed run cannot go on from its saved data position."""

import jax
import numpy as np

from transformer_jax.config_checks import ConfigError
from transformer_jax.data import budget_rows, bucketed_dataset, train_dataset


def token_share(config, num_local_devices: int) -> tuple[int, int]:
    """This process's share of `data.tokens_per_batch`, and the multiple its rows must be
    (whole micro-batches on every local device)."""
    return (config.data.tokens_per_batch // jax.process_count(),
            num_local_devices * config.accumulation_steps)


def batch_rows(config, num_local_devices: int) -> int:
    """This process's rows per update: `per_device_batch_size` per device, or as many
    full-length rows as its share of `data.tokens_per_batch` holds (§5.1)."""
    d = config.data
    if not d.tokens_per_batch:
        return config.per_device_batch_size * num_local_devices
    tokens, multiple = token_share(config, num_local_devices)
    longest = max(d.max_source_length, d.max_target_length)
    rows = budget_rows(tokens, longest, multiple)
    if not rows:
        each = (f" in each of {jax.process_count()} processes" if jax.process_count() > 1
                else "")
        why = (f"{num_local_devices} device{'s' * (num_local_devices > 1)} × "
               f"{config.accumulation_steps} micro-batch"
               f"{'es' * (config.accumulation_steps > 1)}")
        raise ConfigError(f"config.data.tokens_per_batch={d.tokens_per_batch} holds no "
                          f"{multiple} rows of {longest} tokens{each} ({why}); raise it")
    return rows


def new_shuffle_seed(seed: int, step: int) -> int:
    """The data seed of a run resumed at `step` without its data position: drawn from
    (seed, step), so that the resumed run does not replay the batches of its first steps."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def train_batches(config, source, rows: int, num_local_devices: int, seed: int, *,
                  announce: bool = True):
    """The run's endless training batches: packed (`rows` rows) or bucketed, shuffled by `seed`
    (with `announce`, process 0 prints the buckets)."""
    d = config.data
    common = dict(max_source_length=d.max_source_length, max_target_length=d.max_target_length,
                  too_long=d.too_long, seed=seed, num_workers=d.num_workers,
                  shard_index=jax.process_index(), shard_count=jax.process_count())
    if announce and jax.process_index() == 0 and (line := too_long_line(d, source)):
        print(line)
    if d.batching == "packed":
        return train_dataset(source, batch_size=rows, **common)
    if d.tokens_per_batch:
        tokens, multiple = token_share(config, num_local_devices)
        budget = dict(tokens_per_batch=tokens, rows_multiple=multiple)
    else:
        budget = dict(batch_size=rows)
    return bucketed_dataset(source, num_buckets=d.num_buckets, **budget, **common,
                            log=print if announce and jax.process_index() == 0 else None)


def too_long_line(data_config, source) -> str | None:
    """How many training pairs (a PreparedSplit `source`) are longer than a row, and what
    config.data.too_long does with them; None when every pair fits."""
    too_long = ((source.lengths("inputs") > data_config.max_source_length)
                | (source.lengths("targets") > data_config.max_target_length))
    count, total = int(too_long.sum()), len(too_long)
    if not count:
        return None
    done = ("dropped (config.data.too_long='drop')" if data_config.too_long == "drop" else
            "cut to fit (config.data.too_long='truncate'; 'drop' leaves them out)")
    return (f"{count:,} of {total:,} training pairs ({count / total:.1%}) are longer than "
            f"a row ({data_config.max_source_length} + {data_config.max_target_length} "
            f"tokens): {done}")
