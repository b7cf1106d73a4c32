"""Attention masks: literal expected matrices written out by hand."""

import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_array_equal

from transformer_jax.masks import causal_mask, combine_masks, padding_mask, segment_mask

B = np.bool_


def check_mask(mask, expected):
    """Mask is bool and equals `expected` in shape and values."""
    assert mask.dtype == jnp.bool_
    assert mask.shape == expected.shape
    assert_array_equal(np.asarray(mask), expected)


def test_padding_mask_hides_pad_keys():
    """padding_mask is (B,1,1,S), False exactly at pad_id=0 keys."""
    expected_B11S = np.array([[[[1, 1, 0, 0]]], [[[1, 0, 0, 0]]]], dtype=B)
    check_mask(padding_mask([[7, 3, 0, 0], [1, 0, 0, 0]]), expected_B11S)


def test_padding_mask_custom_pad_id():
    """A custom pad_id is the masked value, and 0 becomes an ordinary token."""
    expected_B11S = np.array([[[[1, 0, 1, 0, 1]]]], dtype=B)
    check_mask(padding_mask([[0, -1, 4, -1, 2]], pad_id=-1), expected_B11S)


def test_padding_mask_hides_only_the_pad_id_not_the_ids_below_it():
    """A pad_id inside the range of ids hides that id alone: ids below it are real tokens."""
    expected_B11S = np.array([[[[1, 0, 1, 1, 0, 1]]]], dtype=B)
    check_mask(padding_mask([[5, 3, 1, 0, 3, 4]], pad_id=3), expected_B11S)


def test_causal_mask_is_lower_triangular():
    """causal_mask(4) is (1,1,4,4) lower triangular including the diagonal."""
    expected_11TT = np.array(
        [[[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]]], dtype=B
    )
    check_mask(causal_mask(4), expected_11TT)


def test_segment_mask_self_attention():
    """Segments [[1,1,2,2,0]] give block-diagonal (1,1,5,5); padding sees padding."""
    expected_B1TS = np.array(
        [
            [
                [
                    [1, 1, 0, 0, 0],
                    [1, 1, 0, 0, 0],
                    [0, 0, 1, 1, 0],
                    [0, 0, 1, 1, 0],
                    [0, 0, 0, 0, 1],
                ]
            ]
        ],
        dtype=B,
    )
    check_mask(segment_mask([[1, 1, 2, 2, 0]]), expected_B1TS)


def test_segment_mask_encoder_decoder():
    """Separate query (T=3) and key (S=4) segments give (B,1,3,4): same id only."""
    q_seg_BT = [[1, 2, 2], [1, 1, 0]]
    k_seg_BS = [[1, 1, 2, 0], [1, 0, 0, 0]]
    expected_B1TS = np.array(
        [
            [[[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0]]],
            [[[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 1]]],
        ],
        dtype=B,
    )
    check_mask(segment_mask(q_seg_BT, k_seg_BS), expected_B1TS)


def test_combine_causal_and_padding():
    """causal AND padding broadcasts to (B,1,4,4) with the literal values."""
    combined = combine_masks(causal_mask(4), padding_mask([[7, 3, 0, 0], [5, 6, 8, 0]]))
    expected_B1TT = np.array(
        [
            [[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]],
            [[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]],
        ],
        dtype=B,
    )
    check_mask(combined, expected_B1TT)


def test_combine_three_masks():
    """causal AND segment AND padding is the elementwise AND of all three."""
    tokens_BT = [[4, 5, 6, 7, 0]]
    combined = combine_masks(
        causal_mask(5), segment_mask([[1, 1, 2, 2, 0]]), padding_mask(tokens_BT)
    )
    expected_B1TT = np.array(
        [
            [
                [
                    [1, 0, 0, 0, 0],
                    [1, 1, 0, 0, 0],
                    [0, 0, 1, 0, 0],
                    [0, 0, 1, 1, 0],
                    [0, 0, 0, 0, 0],
                ]
            ]
        ],
        dtype=B,
    )
    check_mask(combined, expected_B1TT)


def test_combine_all_none_is_none():
    """combine_masks() and combine_masks(None, None) return None."""
    assert combine_masks() is None
    assert combine_masks(None, None) is None


def test_combine_skips_none():
    """combine_masks(None, m) returns m's values."""
    m_B11S = padding_mask([[1, 0, 2]])
    check_mask(combine_masks(None, m_B11S), np.array([[[[1, 0, 1]]]], dtype=B))


def test_combine_rejects_float_mask():
    """A float mask raises ValueError."""
    with pytest.raises(ValueError):
        combine_masks(causal_mask(3), jnp.ones((1, 1, 3, 3), dtype=jnp.float32))


def test_combine_rejects_rank3_mask():
    """A rank-3 bool mask raises ValueError."""
    with pytest.raises(ValueError):
        combine_masks(jnp.ones((1, 3, 3), dtype=jnp.bool_))


@pytest.mark.parametrize("call, message", [
    (lambda: padding_mask(jnp.array([7, 3, 0])),
     r"key_input must be \(B, length\) ids, got shape \(3,\)"),
    (lambda: segment_mask(jnp.array([1, 1, 2])), r"query_input must be \(B, length\) ids"),
    (lambda: segment_mask(jnp.ones((1, 3), jnp.int32), jnp.array([1, 2])), "key_input must be"),
    (lambda: segment_mask(jnp.ones((2, 4), jnp.int32), jnp.ones((3, 5), jnp.int32)),
     r"^query_input \(2, 4\) and key_input \(3, 5\) must have the same batch B \(or 1\)$"),
    (lambda: causal_mask(0), "causal_mask's length must be a positive integer, got 0"),
    (lambda: causal_mask(2.5), "causal_mask's length must be a positive integer, got 2.5"),
    (lambda: combine_masks(causal_mask(4), causal_mask(3)),
     r"must broadcast together, got shapes \(1, 1, 4, 4\), \(1, 1, 3, 3\)"),
])
def test_bad_inputs_are_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_segment_mask_of_one_row_broadcasts_over_the_others():
    """Query segments of one row against keys of two, as flax's make_attention_mask takes
    them: (2, 1, T, S), row b comparing the one query row with key row b."""
    mask = segment_mask(jnp.array([[1, 1, 2]]), jnp.array([[1, 2, 2], [2, 2, 0]]))
    np.testing.assert_array_equal(mask[:, 0], [[[1, 0, 0], [1, 0, 0], [0, 1, 1]],
                                               [[0, 0, 0], [0, 0, 0], [1, 1, 0]]])


def test_causal_mask_takes_numpy_ints():
    np.testing.assert_array_equal(causal_mask(np.int64(3)), causal_mask(3))
