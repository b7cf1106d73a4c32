"""Sentence pairs to batches, with grain: tokenize, cut or drop, pack, batch.

Training batches are packed: several pairs share each fixed-length row, told
apart by segment ids (1, 2, ...; 0 is padding) and positions that restart at 0
in every segment, the keys `Transformer.__call__` takes:

    inputs, inputs_segmentation, inputs_positions      (B, max_source_length)
    targets, targets_segmentation, targets_positions   (B, max_target_length)

A batch of B rows holds at most B * max_target_length target tokens: the
paper's token budget (§5.1, about 25k per step) is a choice of B and length.

Evaluation batches are padded, never packed, and hold every example once:
`example_mask` is False on the rows that only pad the last batch.
"""

import dataclasses
import math

import grain
import numpy as np

from transformer_jax.data.packing import PackedBatchIterDataset
from transformer_jax.data.sources import DataError
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.token_ids import PAD_ID

TOO_LONG = ("truncate", "drop")


CHUNK = 256  # pairs tokenized per grain element: grain's cost is per element, not per pair


@dataclasses.dataclass(frozen=True)
class Tokenize:
    """Token ids of pairs, each side ending in EOS; too-long pairs cut or dropped (None)."""

    tokenizer: Tokenizer
    max_source_length: int
    max_target_length: int
    too_long: str = "truncate"

    def __call__(self, pair):
        return self.many([pair])[0]

    def many(self, pairs) -> list:
        """One sentencepiece call per side for the whole list."""
        sources = self.tokenizer.encode_batch([p["source"] for p in pairs], add_eos=True)
        targets = self.tokenizer.encode_batch([p["target"] for p in pairs], add_eos=True)
        return [self._fit(inputs, targets) for inputs, targets in zip(sources, targets)]

    def _fit(self, inputs, targets):
        if len(inputs) > self.max_source_length or len(targets) > self.max_target_length:
            if self.too_long == "drop":
                return None
            # A cut target loses its EOS: the model is not taught to stop there.
            inputs, targets = inputs[: self.max_source_length], targets[: self.max_target_length]
        return {"inputs": np.asarray(inputs, np.int32), "targets": np.asarray(targets, np.int32)}


def train_dataset(pairs, tokenizer: Tokenizer, *, batch_size: int, max_source_length: int,
                  max_target_length: int, too_long: str = "truncate", seed: int = 0,
                  num_threads: int = 2) -> grain.IterDataset:
    """Endless packed training batches from this process's `pairs` (a sequence).

    Each epoch is shuffled anew; the order is fixed by `seed`. `iter(...)` gives
    an iterator whose `get_state()` / `set_state()` resume exactly (the state is
    a small JSON-able dict: save it with the checkpoint).
    """
    if too_long not in TOO_LONG:
        raise ValueError(f"too_long must be one of {TOO_LONG}, got {too_long!r}")
    if not len(pairs):
        raise DataError("no training pairs: the training split is empty")
    tokenize = Tokenize(tokenizer, max_source_length, max_target_length, too_long)
    chunks = (grain.MapDataset.source(pairs).seed(seed).shuffle().repeat()
              .batch(CHUNK, batch_fn=list).map(tokenize.many)
              .to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=4)))
    return PackedBatchIterDataset(
        chunks, batch_size=batch_size,
        lengths={"inputs": max_source_length, "targets": max_target_length},
        examples_per_epoch=len(pairs))


def eval_batches(pairs, tokenizer: Tokenizer, *, batch_size: int, max_source_length: int,
                 max_target_length: int, shard_index: int = 0, shard_count: int = 1):
    """Padded batches holding every example of `pairs` exactly once.

    Every process gets the same number of batches (some may be all padding), so
    collective evaluation steps line up. Too-long examples are cut, never
    dropped. Each batch has `inputs`, `targets`, `example_mask` (False on padding
    rows) and `index` (the example's position in `pairs`, -1 on padding rows).
    """
    examples = list(pairs)
    tokenize = Tokenize(tokenizer, max_source_length, max_target_length, "truncate")
    mine = list(range(len(examples)))[shard_index::shard_count]
    num_batches = math.ceil(math.ceil(len(examples) / shard_count) / batch_size)
    for b in range(num_batches):
        indices = mine[b * batch_size:(b + 1) * batch_size]
        batch = {
            "inputs": np.full((batch_size, max_source_length), PAD_ID, np.int32),
            "targets": np.full((batch_size, max_target_length), PAD_ID, np.int32),
            "example_mask": np.zeros((batch_size,), bool),
            "index": np.full((batch_size,), -1, np.int32),
        }
        for row, i in enumerate(indices):
            ids = tokenize(examples[i])
            batch["inputs"][row, : len(ids["inputs"])] = ids["inputs"]
            batch["targets"][row, : len(ids["targets"])] = ids["targets"]
            batch["example_mask"][row] = True
            batch["index"][row] = i
        yield batch
