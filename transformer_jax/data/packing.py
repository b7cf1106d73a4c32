"""Packing pairs into fixed-length rows: the batches of the paper's token budget.

Each batch is filled from consecutive examples, first fit: an example goes into
the first row where both its source and its target still fit. The batch is
complete when an example fits in no row; that example opens the next batch.

Written here because grain's packers (`grain.experimental.FirstFitPackIterDataset`)
cost about 140 us per pair on a 2-core CPU, which bounds input at about 50
batches of 64 rows per second; this one places a pair with a few numpy ops,
and takes its examples in chunks so grain's per-element cost is paid once per
chunk. Batches never share examples, so the iterator state is just where the
next example is: the parent's state before its chunk and an offset into it.
"""

import grain
import numpy as np

from transformer_jax.data.sources import DataError
from transformer_jax.token_ids import PAD_ID

SUFFIXES = ("", "_segmentation", "_positions")


class PackedBatchIterDataset(grain.IterDataset):
    """Batches of `batch_size` packed rows from chunks (lists) of examples.

    An example is {"inputs": ids, "targets": ids} (1-D int32), or None for one
    that was dropped. Rows carry the keys the model takes: for each side, the
    ids, the segment ids (1, 2, ... per example, 0 for padding) and positions
    (0, 1, ... per example): `inputs`, `inputs_segmentation`, `inputs_positions`,
    and the same for `targets`.
    """

    def __init__(self, chunks: grain.IterDataset, *, batch_size: int, lengths: dict[str, int],
                 examples_per_epoch: int | None = None):
        """`examples_per_epoch`: with it, a run of that many dropped examples (an epoch
        where none fits) raises a DataError instead of looking for one forever."""
        super().__init__(chunks)
        self._batch_size = batch_size
        self._lengths = dict(lengths)
        self._examples_per_epoch = examples_per_epoch

    def __iter__(self):
        return _PackedBatchIterator(self._parent.__iter__(), self._batch_size, self._lengths,
                                    self._examples_per_epoch)


class _PackedBatchIterator(grain.DatasetIterator):
    def __init__(self, chunks, batch_size: int, lengths: dict[str, int],
                 examples_per_epoch: int | None):
        super().__init__(chunks)
        self._batch_size = batch_size
        self._lengths = lengths
        self._examples_per_epoch = examples_per_epoch
        self._chunk_state = chunks.get_state()  # the parent's state before self._chunk
        self._chunk, self._offset = [], 0  # the next example is self._chunk[self._offset]

    def __next__(self):
        # Ids pad with PAD_ID; segment ids and positions with 0 (segment 0 is padding).
        batch = {key + suffix: np.full((self._batch_size, length),
                                       PAD_ID if suffix == "" else 0, np.int32)
                 for key, length in self._lengths.items() for suffix in SUFFIXES}
        used = {key: np.zeros((self._batch_size,), np.int64) for key in self._lengths}
        count = np.zeros((self._batch_size,), np.int32)
        while True:
            try:
                example = self._peek()
            except StopIteration:
                if count.any():  # a finite stream ends with its last, partial batch
                    return batch
                raise
            sizes = {key: len(example[key]) for key in self._lengths}
            fits = np.ones((self._batch_size,), bool)
            for key, length in self._lengths.items():
                fits &= used[key] + sizes[key] <= length
            if not fits.any():
                if not count.any():
                    raise ValueError(f"an example of sizes {sizes} is longer than the rows "
                                     f"{self._lengths}: cut or drop it before packing")
                return batch  # the example opens the next batch
            self._offset += 1
            row = int(np.argmax(fits))
            count[row] += 1
            for key in self._lengths:
                start, end = used[key][row], used[key][row] + sizes[key]
                batch[key][row, start:end] = example[key]
                batch[key + "_segmentation"][row, start:end] = count[row]
                batch[key + "_positions"][row, start:end] = np.arange(sizes[key])
                used[key][row] = end

    def _peek(self):
        """The next example that was not dropped; StopIteration when the parent ends."""
        dropped = 0
        while True:
            while self._offset < len(self._chunk):
                if self._chunk[self._offset] is not None:
                    return self._chunk[self._offset]
                self._offset += 1
                dropped += 1
                if dropped == self._examples_per_epoch:
                    raise DataError(f"all {dropped} examples of an epoch were dropped: none fits "
                                    f"the rows {self._lengths}; cut them instead (too_long="
                                    f"'truncate') or make the rows longer")
            self._chunk_state = self._parent.get_state()
            self._chunk, self._offset = next(self._parent), 0

    def get_state(self):
        return {"chunks": self._chunk_state, "offset": self._offset}

    def set_state(self, state):
        self._parent.set_state(state["chunks"])
        self._chunk_state = state["chunks"]
        self._chunk = next(self._parent) if state["offset"] else []
        self._offset = state["offset"]
