"""The `pipeline` suite: how fast the input pipeline feeds packed training batches.

The default run's data (configs/default.py): the built-in numbers dataset,
German -> English, a 512-piece SentencePiece vocabulary, rows of 16 + 32
tokens. On machines of 8 cores or more (a GPU host), also the GPU step's batch:
96 rows of 256 + 256 tokens, at 1 to all cores' worth of threads. Examples are
sentence pairs packed into the rows (counted from the segment ids); tokens are
the non-padding source and target tokens.
"""

import os

import tempfile
import time

import numpy as np

from transformer_jax.data import get_tokenizer, load_split, train_dataset
from transformer_jax.run_config import data_fields


def _packed_counts(batch: dict) -> tuple[int, int, int]:
    """(examples, source tokens, target tokens) in one packed batch."""
    examples = int(batch["targets_segmentation"].max(axis=1).sum())
    return (examples, int(np.count_nonzero(batch["inputs"])),
            int(np.count_nonzero(batch["targets"])))


def time_batches(dataset, num_batches: int, warmup: int) -> dict:
    """Reads `warmup` batches (threads start, buffers fill), then times `num_batches`."""
    batches = iter(dataset)
    for _ in range(warmup):
        next(batches)
    examples = source = target = 0
    start = time.perf_counter()
    for _ in range(num_batches):
        counts = _packed_counts(next(batches))
        examples, source, target = examples + counts[0], source + counts[1], target + counts[2]
    seconds = time.perf_counter() - start
    return {"batches_per_sec": num_batches / seconds, "examples_per_sec": examples / seconds,
            "tokens_per_sec": (source + target) / seconds,
            "target_tokens_per_sec": target / seconds}


def cases(quick: bool) -> list[tuple[int, int, int, int]]:
    """(batch, source row length, target row length, threads)."""
    if quick:
        return [(8, 16, 32, 1)]
    default = [(64, 16, 32, 1), (64, 16, 32, 2)]
    cores = os.cpu_count() or 1
    if cores < 8:
        return default
    return default + [(96, 256, 256, t) for t in (1, 4, 8, 16, 32) if t <= cores]


def run(quick: bool = False) -> tuple[list[dict], list[str]]:
    # configs/default.py's data group (the package cannot import configs/).
    data = data_fields(numbers_size="small" if quick else "full", max_source_length=16,
                       max_target_length=32)
    pairs = load_split(data, "train").pairs
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        tokenizer = get_tokenizer(data, workdir, pairs)
        for batch_size, source_len, target_len, threads in cases(quick):
            dataset = train_dataset(pairs, tokenizer, batch_size=batch_size,
                                    max_source_length=source_len,
                                    max_target_length=target_len, num_threads=threads)
            long = source_len > data.max_source_length
            figures = time_batches(dataset, num_batches=10 if quick else (40 if long else 300),
                                   warmup=2 if quick else (4 if long else 20))
            rows.append({"dataset": f"numbers ({data.numbers_size})", "batch": batch_size,
                         "row_tokens": source_len + target_len,
                         "threads": threads, **figures})
    return rows, ["examples: sentence pairs packed into the rows",
                  "tokens: non-padding source + target tokens"]
