"""The special token ids that batches, masks, losses, the model and the searches share.

    PAD_ID = 0     padding: masks hide it, losses weigh it 0, searches write it after EOS
    EOS_ID = 1     end of sentence: the tokenizer appends it, a search stops at it
    BOS_ID = 2     reserved by the tokenizer; the decoder does not start from it
    UNK_ID = 3     unknown; never emitted for text (the tokenizer falls back to bytes)

    DECODER_START_ID = PAD_ID   the first input of the decoder, whose input is the
                                output shifted right (§3.1), as in tensor2tensor

`check_ids` is what every array of ids given to the model and the losses must be. No JAX
here: the processes that tokenize a corpus import this module without it.
"""

import numpy as np

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3
DECODER_START_ID = PAD_ID


def check_ids(ids, name: str, vocab_size: int, *, batched: bool = False,
              bound: str = "vocab_size") -> None:
    """A one-line error unless `ids` is an array of integers, each in [0, `vocab_size`)
    where the values are known, and `(B, T)` if `batched`: a TypeError for a list or
    another dtype, a ValueError for another shape or naming the lowest and highest id.
    Traced ids (inside `jax.jit`) are checked for their dtype and shape only; nothing is
    added to the traced program. `bound` names what `vocab_size` is, in the message."""
    dtype, shape = getattr(ids, "dtype", None), getattr(ids, "shape", None)
    if dtype is None or shape is None:
        raise TypeError(f"{name} must be an array of integer ids, got a {type(ids).__name__}"
                        f" (jnp.asarray makes one)")
    if not np.issubdtype(dtype, np.integer):
        raise TypeError(f"{name} must be integer ids, got {dtype}")
    if batched and len(shape) != 2:
        raise ValueError(f"{name} must be (B, T), got shape {tuple(shape)}; a single "
                         f"sequence is ids[None]")
    try:
        values = np.asarray(ids)
    except TypeError:  # jax.errors.TracerArrayConversionError: traced, not known yet
        return
    if values.size and (values.min() < 0 or values.max() >= vocab_size):
        raise ValueError(f"{name} must be in [0, {vocab_size}) ({bound}), got ids from "
                         f"{values.min()} to {values.max()}")
