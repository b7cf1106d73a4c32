"""The packer: first fit into rows, literal expected batches, exact resume inside a chunk."""

import grain
import numpy as np
import pytest

from transformer_jax.data.packing import PackedBatchIterDataset


def ex(inputs, targets):
    return {"inputs": np.asarray(inputs, np.int32), "targets": np.asarray(targets, np.int32)}


# Chunks as the pipeline makes them; None is a dropped pair.
CHUNKS = [[ex([11, 12], [13, 14, 15]), ex([21, 22, 23], [24])],
          [None, ex([31], [32]), ex([41, 42], [43, 44])]]


def packed(chunks, batch_size=2, lengths=None):
    parent = grain.MapDataset.source(chunks).to_iter_dataset()
    return iter(PackedBatchIterDataset(parent, batch_size=batch_size,
                                       lengths=lengths or {"inputs": 4, "targets": 4}))


def test_first_fit_literal_batch():
    """Pair 3 joins row 0 (it fits there first); pair 4 fits nowhere and opens the next batch."""
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
    """The next batch starts with pair 4; a finite stream ends after its last partial batch."""
    it = packed(CHUNKS + [[ex([51, 52, 53, 54], [55, 56, 57, 58])]])
    next(it)
    second = next(it)
    np.testing.assert_array_equal(second["inputs"], [[41, 42, 0, 0], [51, 52, 53, 54]])
    np.testing.assert_array_equal(second["targets_segmentation"], [[1, 1, 0, 0], [1, 1, 1, 1]])
    with pytest.raises(StopIteration):
        next(it)


def test_state_inside_a_chunk_resumes_exactly():
    """The state after batch 1 points into the second chunk; a new iterator continues there."""
    chunks = [[ex([i], [i, i + 1]) for i in range(start, start + 5)] for start in (1, 6, 11)]
    first = packed(chunks, batch_size=1, lengths={"inputs": 2, "targets": 4})
    for _ in range(3):
        next(first)
    state = first.get_state()
    assert state["offset"] != 0
    rest = [next(first)["inputs"].tolist() for _ in range(4)]
    resumed = packed(chunks, batch_size=1, lengths={"inputs": 2, "targets": 4})
    resumed.set_state(state)
    assert [next(resumed)["inputs"].tolist() for _ in range(4)] == rest
    assert rest == [[[7, 8]], [[9, 10]], [[11, 12]], [[13, 14]]]


def test_an_example_longer_than_a_row_is_an_error():
    with pytest.raises(ValueError, match="longer than the rows"):
        next(packed([[ex([1, 2, 3, 4, 5], [1])]]))
