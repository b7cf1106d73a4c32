"""Output ids for many sources: length-sorted, bucketed batches through `predict_step`.

    outputs = predict(model, params, tokenizer.encode_batch(sources, add_eos=True),
                      beam_size=4, alpha=0.6, max_extra_length=50)
    tokenizer.decode_batch(outputs)  # the translations, in the sources' order

Used by `Translator.translate` and by the trainer's BLEU evaluation alike. A source of
EOS alone (an empty line) is not searched: its output is EOS alone, "" (`skip_empty`).
"""

import jax
import numpy as np
import tqdm

from transformer_jax.model import cast_matmul_params
from transformer_jax.steps import predict_step
from transformer_jax.token_ids import EOS_ID, PAD_ID

BUCKET = 8  # source lengths are rounded up to a multiple of this: fewer compilations

_predict_step = jax.jit(predict_step,
                        static_argnames=("model", "beam_size", "max_length", "alpha"))


def _padded_batch(rows: list[list[int]], batch_size: int,
                  max_length: int | None = None) -> np.ndarray:
    """`rows` as one int32 `(B, S)` array: S the longest row rounded up to a multiple of
    BUCKET (but not past `max_length`, a learned position table's rows, where given), B the
    row count rounded up to a power of two (at most `batch_size`); PAD_ID fills the rest,
    so few shapes compile."""
    longest = max(len(ids) for ids in rows)
    length = -(-longest // BUCKET) * BUCKET
    if max_length is not None:  # a longer row fails in the model, naming the table
        length = max(min(length, max_length), longest)
    height = min(batch_size, 1 << (len(rows) - 1).bit_length())
    inputs_BS = np.full((height, length), PAD_ID, np.int32)
    for row, ids in enumerate(rows):
        inputs_BS[row, :len(ids)] = ids
    return inputs_BS


def predict(model, params, source_ids: list[list[int]], *, beam_size: int, alpha: float,
            max_extra_length: int, batch_size: int = 32,
            progress: bool = False) -> list[np.ndarray]:
    """The output ids of each source (ids ending with EOS), in the sources' order.

    Sources are sorted by length and searched `batch_size` at a time, so similar
    lengths share a compiled search; each batch's outputs run up to its padded
    source length + `max_extra_length` tokens (§6.1: input length + 50), and no more
    than a learned position table has rows (`output_length`). `beam_size` 1 is greedy
    search. Each output is a 1-D array that `Tokenizer.decode` reads up
    to its first EOS. Sources of EOS alone are not searched (`skip_empty`).

    The matrices are cast to the model's compute dtype once for all the batches
    (`cast_matmul_params`), not once per batch.
    """
    params = cast_matmul_params(params, model.config.compute_dtype)

    def search(rows):
        return _search_sorted(model, params, rows, beam_size=beam_size, alpha=alpha,
                              max_extra_length=max_extra_length, batch_size=batch_size,
                              progress=progress)

    return skip_empty(search, source_ids)


def position_rows(config) -> int | None:
    """The rows of the model's learned position table (`config.max_length`): no position
    past them has an encoding, in a source or an output. None for encodings of any length."""
    return config.max_length if config.positional_encoding == "learned" else None


def output_length(config, source_length: int, max_extra_length: int) -> int:
    """The most tokens a search writes: the (padded) source length + `max_extra_length`
    (§6.1), and no more than a learned position table's rows (`position_rows`)."""
    return min(source_length + max_extra_length, position_rows(config) or float("inf"))


def skip_empty(search, source_ids: list[list[int]]) -> list:
    """`search(rows) -> outputs` (one per row, in order) on the sources that have ids
    before their EOS; each other source (an empty line: its tokenization is empty) gets
    `[EOS_ID]`, which decodes to "", with no search. The outputs in the sources' order.

    Searched, EOS alone would get whatever the model learnt to write for no input (the
    numbers model writes a number); CTranslate2 returns no tokens for it, as here.
    """
    chosen = [i for i, ids in enumerate(source_ids) if any(t != EOS_ID for t in ids)]
    outputs = [np.array([EOS_ID], np.int32) for _ in source_ids]
    if chosen:
        for i, output in zip(chosen, search([source_ids[i] for i in chosen])):
            outputs[i] = output
    return outputs


def _search_sorted(model, params, source_ids: list[list[int]], *, beam_size: int,
                   alpha: float, max_extra_length: int, batch_size: int,
                   progress: bool) -> list[np.ndarray]:
    """`predict`'s search of every source, in length-sorted batches."""
    order = sorted(range(len(source_ids)), key=lambda i: len(source_ids[i]))
    outputs: list[np.ndarray] = [np.zeros((0,), np.int32)] * len(source_ids)
    starts = range(0, len(order), batch_size)
    # A `with`: an error or Ctrl-C ends the bar's line at once, before the error is said.
    with tqdm.tqdm(starts, desc="translating", unit="batch", disable=not progress) as bar:
        for start in bar:
            chosen = order[start:start + batch_size]
            inputs_BS = _padded_batch([source_ids[i] for i in chosen], batch_size,
                                      position_rows(model.config))
            outputs_BT = _predict_step(params, inputs_BS, model=model, beam_size=beam_size,
                                       alpha=alpha, max_length=output_length(
                                           model.config, inputs_BS.shape[1], max_extra_length))
            for i, output_T in zip(chosen, np.asarray(outputs_BT)):
                outputs[i] = output_T
    return outputs
