"""Packing pairs into fixed-length rows: the batches of the paper's token budget.

Each batch is filled from consecutive examples, first fit: an example goes into
the first row where both its source and its target still fit. The batch is
complete when an example fits in no row; that example opens the next batch.

Examples come as chunks of indices into a prepared split (`prepared.PreparedSplit`),
whose lengths are known before any id is read. So placing an example is a few
integer comparisons on its two lengths, and a batch's ids are then copied in a
handful of vectorised NumPy operations (one gather from the memory-mapped ids,
one scatter into the rows), not one pair at a time.

Written here rather than with grain's packers (`grain.experimental.FirstFitPackIterDataset`,
`BestFitPackIterDataset`): those take one example (a dict of arrays) per grain
element and place it with per-example array work; the pipeline benchmark
measures them beside this one at the same row sizes. Batches never share
examples, so the iterator state is where the next example is: the parent's
state before its chunk and an offset into it.
"""

import grain
import numpy as np

from transformer_jax.token_ids import PAD_ID

SUFFIXES = ("", "_segmentation", "_positions")


class PackedBatchIterDataset(grain.IterDataset):
    """Batches of `batch_size` packed rows from chunks (1-D int arrays) of example indices.

    `source` is a prepared split (`lengths(side)`, `gather(side, indices, counts)`);
    `lengths` maps each side ("inputs", "targets") to its row length. An example
    longer than a row is cut to it (drop such examples from the chunks to drop them).
    Rows carry the keys the model takes: for each side, the ids, the segment ids
    (1, 2, ... per example, 0 for padding) and positions (0, 1, ... per example).
    """

    def __init__(self, chunks: grain.IterDataset, source, *, batch_size: int,
                 lengths: dict[str, int]):
        super().__init__(chunks)
        self._source = source
        self._batch_size = batch_size
        self._lengths = dict(lengths)

    def __iter__(self):
        return _PackedBatchIterator(self._parent.__iter__(), self._source, self._batch_size,
                                    self._lengths)


class _PackedBatchIterator(grain.DatasetIterator):
    def __init__(self, chunks, source, batch_size: int, lengths: dict[str, int]):
        super().__init__(chunks)
        self._source, self._batch_size, self._lengths = source, batch_size, lengths
        # Every example's size in a row, per side: its length, cut to the row.
        self._sizes = {key: np.minimum(source.lengths(key), length)
                       for key, length in lengths.items()}
        self._chunk_state = chunks.get_state()  # the parent's state before self._chunk
        self._chunk = np.zeros((0,), np.int64)
        self._chunk_sizes = [[], []]  # the chunk's sizes per side, as Python ints
        self._offset = 0  # the next example is self._chunk[self._offset]

    def __next__(self):
        placed = self._place()
        if not placed[0]:
            raise StopIteration
        return self._assemble(*placed)

    def _place(self):
        """First fit of the next examples into one batch's rows: (examples, rows, starts per
        side, sizes per side), in the order placed."""
        (source_len, target_len), rows = self._lengths.values(), self._batch_size
        free_s, free_t = [source_len] * rows, [target_len] * rows
        examples, where = [], []
        start_s, start_t, size_s, size_t = [], [], [], []
        while self._offset < len(self._chunk) or self._next_chunk():
            s = self._chunk_sizes[0][self._offset]
            t = self._chunk_sizes[1][self._offset]
            for row in range(rows):  # integer comparisons: the per-example cost
                if free_s[row] >= s and free_t[row] >= t:
                    break
            else:
                break  # fits in no row: the batch is complete, and it opens the next one
            examples.append(self._chunk[self._offset])
            where.append(row)
            start_s.append(source_len - free_s[row])
            start_t.append(target_len - free_t[row])
            size_s.append(s)
            size_t.append(t)
            free_s[row] -= s
            free_t[row] -= t
            self._offset += 1
        return examples, where, (start_s, start_t), (size_s, size_t)

    def _next_chunk(self) -> bool:
        """Moves to the parent's next chunk; False when the parent has ended."""
        state = self._parent.get_state()
        try:
            chunk = np.asarray(next(self._parent), np.int64)
        except StopIteration:
            return False
        self._chunk_state, self._chunk, self._offset = state, chunk, 0
        self._chunk_sizes = [self._sizes[key][chunk].tolist() for key in self._lengths]
        return True

    def _assemble(self, examples, rows, starts, sizes) -> dict[str, np.ndarray]:
        """The batch's arrays, each side filled by one gather and one scatter."""
        examples, rows = np.asarray(examples, np.int64), np.asarray(rows, np.int64)
        # Segment ids: the example's rank among those placed in its row, from 1.
        order = np.argsort(rows, kind="stable")
        firsts = np.searchsorted(rows[order], rows[order])  # where each row's run starts
        segment = np.empty_like(rows)
        segment[order] = np.arange(len(rows)) - firsts + 1
        batch = {}
        for (key, length), start, size in zip(self._lengths.items(), starts, sizes):
            size = np.asarray(size, np.int64)
            begins = np.cumsum(size) - size  # where each example begins in the gathered ids
            within = np.arange(size.sum()) - np.repeat(begins, size)  # position in its example
            flat = np.repeat(rows * length + np.asarray(start, np.int64), size) + within
            for suffix, values, fill in (("", self._source.gather(key, examples, size), PAD_ID),
                                         ("_segmentation", np.repeat(segment, size), 0),
                                         ("_positions", within, 0)):
                array = np.full((self._batch_size * length,), fill, np.int32)
                array[flat] = values
                batch[key + suffix] = array.reshape(self._batch_size, length)
        return batch

    def get_state(self):
        return {"chunks": self._chunk_state, "offset": self._offset}

    def set_state(self, state):
        self._parent.set_state(state["chunks"])
        # Its chunk state too: get_state() before the next batch is then the state restored.
        self._chunk_state = state["chunks"]
        self._chunk, self._offset = np.zeros((0,), np.int64), 0
        if state["offset"]:
            self._next_chunk()
            self._offset = state["offset"]
