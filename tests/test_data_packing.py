"""The packer: first fit into rows, literal expected batches, exact resume inside a chunk.

The source is a fake prepared split over hand-written id lists, and the chunks are
lists of indices into it, as the pipeline's ShuffledChunks makes them.
"""

import grain
import numpy as np
import pytest

from transformer_jax.data.packing import PackedBatchIterDataset


class FakeSplit:
    """`lengths` and `gather` of a prepared split, over id lists written by hand."""

    def __init__(self, pairs):
        self.ids = {"inputs": [list(p[0]) for p in pairs], "targets": [list(p[1]) for p in pairs]}

    def lengths(self, side):
        return np.asarray([len(ids) for ids in self.ids[side]], np.int32)

    def gather(self, side, indices, counts):
        out = []
        for i, n in zip(np.asarray(indices).tolist(), np.asarray(counts).tolist()):
            out += self.ids[side][i][:n]
        return np.asarray(out, np.int32)


# Example k: (source ids, target ids).
PAIRS = FakeSplit([([11, 12], [13, 14, 15]), ([21, 22, 23], [24]), ([31], [32]),
                   ([41, 42], [43, 44]), ([51, 52, 53, 54], [55, 56, 57, 58])])
CHUNKS = [[0, 1], [2, 3]]


def packed(chunks, source=PAIRS, batch_size=2, lengths=None):
    parent = grain.MapDataset.source([np.asarray(c, np.int64) for c in chunks]).to_iter_dataset()
    return iter(PackedBatchIterDataset(parent, source, batch_size=batch_size,
                                       lengths=lengths or {"inputs": 4, "targets": 4}))


def test_first_fit_literal_batch():
    """Pair 2 joins row 0 (it fits there first); pair 3 fits nowhere and opens the next batch."""
    batch = next(packed(CHUNKS))
    expected = {
        "inputs": [[11, 12, 31, 0], [21, 22, 23, 0]],
        "inputs_segmentation": [[1, 1, 2, 0], [1, 1, 1, 0]],
        "inputs_positions": [[0, 1, 0, 0], [0, 1, 2, 0]],
        "targets": [[13, 14, 15, 32], [24, 0, 0, 0]],
        "targets_segmentation": [[1, 1, 1, 2], [1, 0, 0, 0]],
        "targets_positions": [[0, 1, 2, 0], [0, 0, 0, 0]],
    }
    assert batch.keys() == expected.keys()
    for key, rows in expected.items():
        np.testing.assert_array_equal(batch[key], rows, err_msg=key)
        assert batch[key].dtype == np.int32


def test_the_pair_that_did_not_fit_opens_the_next_batch():
    """The next batch starts with pair 3; a finite stream ends after its last partial batch."""
    it = packed(CHUNKS + [[4]])
    next(it)
    second = next(it)
    np.testing.assert_array_equal(second["inputs"], [[41, 42, 0, 0], [51, 52, 53, 54]])
    np.testing.assert_array_equal(second["targets"], [[43, 44, 0, 0], [55, 56, 57, 58]])
    np.testing.assert_array_equal(second["targets_segmentation"], [[1, 1, 0, 0], [1, 1, 1, 1]])
    with pytest.raises(StopIteration):
        next(it)


def test_segments_are_numbered_per_row_in_the_order_placed():
    """Rows filled in turn (0, 1, 0, 1, 1): each row numbers its own segments 1, 2, 3."""
    source = FakeSplit([([1, 1, 1], [1]), ([2, 2], [2, 2]), ([3], [3]),
                        ([4], [4]), ([5], [5]), ([6], [6, 6])])
    it = packed([[0, 1, 2, 3, 4, 5]], source)
    batch = next(it)
    np.testing.assert_array_equal(batch["inputs"], [[1, 1, 1, 3], [2, 2, 4, 5]])
    np.testing.assert_array_equal(batch["inputs_segmentation"], [[1, 1, 1, 2], [1, 1, 2, 3]])
    np.testing.assert_array_equal(batch["inputs_positions"], [[0, 1, 2, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(batch["targets"], [[1, 3, 0, 0], [2, 2, 4, 5]])
    np.testing.assert_array_equal(batch["targets_segmentation"], [[1, 2, 0, 0], [1, 1, 2, 3]])
    np.testing.assert_array_equal(batch["targets_positions"], [[0, 0, 0, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(next(it)["targets"], [[6, 6, 0, 0], [0, 0, 0, 0]])


def test_an_example_longer_than_a_row_is_cut_to_it():
    """Cut to the row's length on each side, alone in its row; the next example goes on."""
    source = FakeSplit([([1, 2, 3, 4, 5, 6], [7, 8]), ([9], [10, 11, 12, 13, 14])])
    batch = next(packed([[0, 1]], source, batch_size=2))
    np.testing.assert_array_equal(batch["inputs"], [[1, 2, 3, 4], [9, 0, 0, 0]])
    np.testing.assert_array_equal(batch["inputs_positions"], [[0, 1, 2, 3], [0, 0, 0, 0]])
    np.testing.assert_array_equal(batch["targets"], [[7, 8, 0, 0], [10, 11, 12, 13]])
    np.testing.assert_array_equal(batch["targets_segmentation"], [[1, 1, 0, 0], [1, 1, 1, 1]])


def test_state_inside_a_chunk_resumes_exactly():
    """The state after batch 3 points into the second chunk; a new iterator continues there."""
    source = FakeSplit([([i], [i, i + 1]) for i in range(1, 16)])
    chunks = [list(range(start, start + 5)) for start in (0, 5, 10)]
    first = packed(chunks, source, batch_size=1, lengths={"inputs": 2, "targets": 4})
    assert [next(first)["inputs"].tolist() for _ in range(3)] == [[[1, 2]], [[3, 4]], [[5, 6]]]
    state = first.get_state()
    assert state["offset"] == 1  # example 6 of chunk 1 is placed; example 7 is next
    rest = [next(first)["inputs"].tolist() for _ in range(2)]
    # Batch 5 ended at chunk 1's end: example 11, which did not fit, is chunk 2's first.
    at_chunk_start = first.get_state()
    assert at_chunk_start["offset"] == 0 and at_chunk_start != state
    rest += [next(first)["inputs"].tolist() for _ in range(3)]
    assert rest == [[[7, 8]], [[9, 10]], [[11, 12]], [[13, 14]], [[15, 0]]]
    with pytest.raises(StopIteration):
        next(first)
    resumed = packed(chunks, source, batch_size=1, lengths={"inputs": 2, "targets": 4})
    resumed.set_state(state)
    assert [next(resumed)["inputs"].tolist() for _ in range(5)] == rest
    resumed.set_state(at_chunk_start)
    assert [next(resumed)["inputs"].tolist() for _ in range(3)] == rest[2:]
    # A state restored and saved again before any batch (a resume that saves at once) is
    # the state restored, at a chunk's start too, not the first chunk's.
    for saved, expected in ((state, rest), (at_chunk_start, rest[2:])):
        restored = packed(chunks, source, batch_size=1, lengths={"inputs": 2, "targets": 4})
        restored.set_state(saved)
        assert restored.get_state() == saved
        again = packed(chunks, source, batch_size=1, lengths={"inputs": 2, "targets": 4})
        again.set_state(restored.get_state())
        assert [next(again)["inputs"].tolist() for _ in expected] == expected
