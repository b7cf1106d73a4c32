"""The searches driving the real model through its cache agree with the uncached decoder."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.decoding import beam_search, greedy_search
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config

CONFIG = get_model_config("tiny", vocab_size=30)
MAX_LENGTH = 7


def setup():
    model = Transformer(CONFIG)
    inputs_BS = jnp.array([[5, 6, 7, 8, 0], [9, 3, 0, 0, 0], [4, 4, 4, 4, 4]])
    variables = model.init(jax.random.key(3), inputs_BS, inputs_BS)
    memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    cache = model.apply(variables, memory_BSD, inputs_BS, MAX_LENGTH,
                        method=Transformer.init_cache)
    step = functools.partial(model.apply, variables, method=Transformer.decode_step)
    return model, variables, inputs_BS, cache, step


def uncached_greedy(model, variables, inputs_BS):
    """Greedy decoding that reruns the full decoder on the whole prefix at every step."""
    out_BT = np.zeros((inputs_BS.shape[0], MAX_LENGTH), np.int32)
    for t in range(MAX_LENGTH):
        # Positions >= t get a non-padding stand-in: the full pass masks keys by the targets.
        prefix_BT = np.where(np.arange(MAX_LENGTH)[None] < t, out_BT, 2)
        logits_BTV = model.apply(variables, inputs_BS, jnp.asarray(prefix_BT))
        out_BT[:, t] = 1 + np.argmax(np.asarray(logits_BTV[:, t, 1:]), axis=-1)  # never padding
    for row in out_BT:  # nothing after the first EOS
        ends = np.flatnonzero(row == 1)
        if ends.size:
            row[ends[0] + 1:] = 0
    return out_BT


def test_cached_greedy_equals_uncached_greedy():
    model, variables, inputs_BS, cache, step = setup()
    search = jax.jit(lambda cache: greedy_search(step, cache, batch_size=3, max_length=MAX_LENGTH))
    np.testing.assert_array_equal(search(cache), uncached_greedy(model, variables, inputs_BS))


def test_beam_of_one_equals_greedy_on_the_model():
    _, _, _, cache, step = setup()
    greedy = greedy_search(step, cache, batch_size=3, max_length=MAX_LENGTH)
    beam, _ = beam_search(step, cache, batch_size=3, beam_size=1, max_length=MAX_LENGTH,
                          alpha=0.6)
    np.testing.assert_array_equal(beam, greedy)


def test_cached_beam_search_equals_the_full_decoder_rerun_per_beam():
    """Beam 4 over the cache, where an example's 4 beams read one copy of its encoder keys
    and values, finds the hypotheses and scores of beam 4 over a callback that reruns the
    whole decoder on each beam's own copy of the source (the `decode` suite's uncached
    baseline; both never end a hypothesis)."""
    from transformer_jax.benchmark import decode

    model, variables, inputs_BS, _, _ = setup()
    memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    results = []
    for make in (decode._cached_callback, decode._uncached_callback):
        step, state = make(model, variables, memory_BSD, inputs_BS, MAX_LENGTH)
        results.append(beam_search(step, state, batch_size=3, beam_size=4,
                                   max_length=MAX_LENGTH, alpha=0.6, return_all=True))
    (cached_seqs, cached_scores), (full_seqs, full_scores) = results
    np.testing.assert_array_equal(cached_seqs, full_seqs)
    np.testing.assert_allclose(cached_scores, full_scores, rtol=1e-5)
    assert len({tuple(row) for row in np.asarray(cached_seqs).reshape(12, -1)}) == 12


def test_a_learned_position_table_bounds_the_output_length():
    """With learned positions of 12 rows, a search of a 5-token source (padded to 8) with 50
    extra tokens writes 12 at most (rows past the table have no encoding: they gave NaN
    logits); sinusoidal positions keep source + 50."""
    from transformer_jax.predict import output_length, predict

    learned = get_model_config("tiny", vocab_size=30, positional_encoding="learned",
                               max_length=12, dropout_rate=0.0)
    assert output_length(learned, 5, 50) == 12 and output_length(CONFIG, 5, 50) == 55
    model = Transformer(learned)
    inputs_BS = jnp.array([[5, 6, 7, 8, 1]])
    variables = model.init(jax.random.key(4), inputs_BS, inputs_BS)
    # Random weights rarely write EOS: the search runs to its last position.
    (output,) = predict(model, variables["params"], [[5, 6, 7, 8, 1]], beam_size=1, alpha=0.6,
                        max_extra_length=50)
    assert output.shape == (12,)

