"""Attention masks. Pure jax.numpy, no Flax.

Every mask is bool, True where a query may attend to a key, and broadcastable
to `(B, 1, T, S)`: batch, heads, query length, key length. Masked logits are
set to the most negative value before the softmax (§3.2.1, §3.2.3).
"""

import jax.numpy as jnp

from transformer_jax.argument_checks import positive_int
from transformer_jax.token_ids import PAD_ID


def padding_mask(key_input, *, pad_id: int = PAD_ID):
    """Hides padding keys from every query. Returns `(B, 1, 1, S)`.

    `key_input` holds the token ids of the keys, `(B, S)` (the name is that of
    flax's `make_attention_mask`). For keys `[[7, 3, 0, 0]]` (0 is padding),
    every query row sees:

        [[[[1, 1, 0, 0]]]]

    Only keys are masked: a padding query still attends to the real keys, and
    its output is ignored by the loss. A row is fully masked only when all its
    keys are padding (attention then averages the values uniformly, no NaN).
    """
    key_tokens_BS = _ids_BX(key_input, "key_input")
    return (key_tokens_BS != pad_id)[:, None, None, :]


def _ids_BX(ids, name: str):
    """`ids` as a `(B, X)` array, or a ValueError naming `name` and the shape it had."""
    ids_BX = jnp.asarray(ids)
    if ids_BX.ndim != 2:
        raise ValueError(f"{name} must be (B, length) ids, got shape {ids_BX.shape}; a "
                         f"single sequence is ids[None]")
    return ids_BX


def causal_mask(length: int):
    """Lets query t see keys 0..t only (§3.2.3). Returns `(1, 1, T, T)`.

    For length 4:

        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 1, 1, 0],
         [1, 1, 1, 1]]
    """
    length = positive_int("causal_mask's length", length)
    return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None]


def segment_mask(query_input, key_input=None):
    """Keeps packed examples apart: query and key must share a segment id.

    Returns `(B, 1, T, S)`. Segment ids number the examples packed into one row
    (1, 2, ...) and 0 marks padding. For segments `[[1, 1, 2, 2, 0]]`:

        [[1, 1, 0, 0, 0],
         [1, 1, 0, 0, 0],
         [0, 0, 1, 1, 0],
         [0, 0, 1, 1, 0],
         [0, 0, 0, 0, 1]]

    flax's `make_attention_mask(query_input, key_input, jnp.equal)` builds the same
    mask (as float32), and names the arguments alike.

    Args:
      query_input: segment ids of the queries, `(B, T)`.
      key_input: segment ids of the keys, `(B, S)`; defaults to the queries'
        (self-attention). For encoder-decoder attention, pass the source's.
    """
    query_segments_BT = _ids_BX(query_input, "query_input")
    key_segments_BS = query_segments_BT if key_input is None else _ids_BX(key_input,
                                                                           "key_input")
    if 1 != key_segments_BS.shape[0] != query_segments_BT.shape[0] != 1:  # 1 broadcasts
        raise ValueError(f"query_input {query_segments_BT.shape} and key_input "
                         f"{key_segments_BS.shape} must have the same batch B (or 1)")
    return query_segments_BT[:, None, :, None] == key_segments_BS[:, None, None, :]


def combine_masks(*masks):
    """Logical AND of the masks that are not None; None if all are None.

    Shapes broadcast, so `combine_masks(causal_mask(4), padding_mask(t_B4))`
    gives `(B, 1, 4, 4)`: for keys `[[7, 3, 0, 0]]`,

        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 1, 0, 0],
         [1, 1, 0, 0]]
    """
    present = [jnp.asarray(m) for m in masks if m is not None]
    if not present:
        return None
    for m in present:
        if m.dtype != jnp.bool_ or m.ndim != 4:
            raise ValueError(
                f"masks must be bool arrays of rank 4 (B, 1, T, S); got {m.dtype} {m.shape}"
            )
    try:
        jnp.broadcast_shapes(*(m.shape for m in present))
    except ValueError:
        raise ValueError("masks must broadcast together, got shapes "
                         + ", ".join(str(m.shape) for m in present)) from None
    combined = present[0]
    for m in present[1:]:
        combined = jnp.logical_and(combined, m)
    return combined
