"""Greedy and beam search (§6) with fake `tokens_to_logits` callbacks and brute-force answers."""

import itertools
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from transformer_jax.decoding import (UNROLL, PerExample, beam_search, greedy_search,
                                      length_penalty)

PAD, EOS = 0, 1
NEVER = -1e9  # a logit no search should pick


# ---------------------------------------------------------------- fakes and references


def log_softmax_np(x):
    x = np.asarray(x, np.float64)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def lp_np(length, alpha):
    return ((5 + length) / 6) ** alpha


def markov_fn(tables_EVV):
    """Fake model: logits of the next token from the previous one, per example.

    The cache is {"example": (R,) row of `tables_EVV` to use, "step": (R,) calls so far}.
    """
    tables_EVV = jnp.asarray(tables_EVV, jnp.float32)

    def tokens_to_logits(ids_R1, cache):
        logits_RV = tables_EVV[cache["example"], ids_R1[:, 0]]
        return logits_RV, {"example": cache["example"], "step": cache["step"] + 1}

    return tokens_to_logits


def markov_cache(examples):
    examples = jnp.asarray(examples, jnp.int32)
    return {"example": examples, "step": jnp.zeros_like(examples)}


def markov_logp(table_VV):
    """log P(next | prefix) for the NumPy references, prefix a tuple of generated tokens."""
    logp_VV = log_softmax_np(table_VV)
    return lambda prefix: logp_VV[prefix[-1] if prefix else PAD]


def sequence_score(logp_fn, seq, alpha, max_length):
    """log P(Y) / lp(|Y|) of a returned row: up to EOS, or all of it when there is none."""
    seq = [int(t) for t in seq]
    length = seq.index(EOS) + 1 if EOS in seq else max_length
    logp = sum(logp_fn(tuple(seq[:j]))[seq[j]] for j in range(length))
    return logp / lp_np(length, alpha)


def brute_force_best(logp_fn, vocab, max_length, alpha):
    """The best of all sequences that end in EOS within max_length, by exhaustive search."""
    best_score, best = -math.inf, None
    others = [t for t in range(vocab) if t != EOS]
    for length in range(1, max_length + 1):
        for body in itertools.product(others, repeat=length - 1):
            seq = (*body, EOS)
            score = sequence_score(logp_fn, seq, alpha, max_length)
            if score > best_score:
                best_score, best = score, seq
    return np.array(best + (PAD,) * (max_length - len(best))), best_score


def search_all(tables_EVV, *, beam_size, max_length, alpha):
    """Beam search (all K) and greedy search of every example's table, batched."""
    n = len(tables_EVV)
    fn, cache = markov_fn(tables_EVV), markov_cache(np.arange(n))
    search = partial(beam_search, fn, cache, batch_size=n, max_length=max_length, alpha=alpha)
    seqs, scores = search(beam_size=beam_size, return_all=True)
    greedy = greedy_search(fn, cache, batch_size=n, max_length=max_length)
    return np.asarray(seqs), np.asarray(scores), np.asarray(greedy)


def probability_rows(rows, vocab):
    """Log-probability table from {prev: {next: p}}; unlisted mass spread evenly, PAD ~never."""
    table = np.zeros((vocab, vocab))
    for prev in range(vocab):
        listed = rows.get(prev, {})
        rest = [t for t in range(1, vocab) if t not in listed]
        row = np.full(vocab, (1.0 - sum(listed.values())) / max(len(rest), 1))
        for t, p in listed.items():
            row[t] = p
        row[PAD] = 1e-6
        table[prev] = np.log(row / row.sum())
    return table


def random_tables(seed, examples, vocab, eos_boost=0.0):
    """Random logits; PAD is never produced, EOS made more likely by `eos_boost`."""
    tables = 2.0 * np.random.default_rng(seed).standard_normal((examples, vocab, vocab))
    tables[:, :, EOS] += eos_boost
    tables[:, :, PAD] = NEVER
    return tables.astype(np.float32)


# Greedy takes 2 (p .5) and then EOS (.22): P = .11. Beam search finds 3 (.4), 4 (.9), EOS (.9):
# P = .324, the best of every sequence up to max_length.
TRAP_VOCAB = 6
TRAP_TABLE = probability_rows(
    {
        PAD: {EOS: 0.05, 2: 0.5, 3: 0.4},
        2: {EOS: 0.22, 2: 0.19, 3: 0.19, 4: 0.2, 5: 0.2},
        3: {4: 0.9},
        4: {EOS: 0.9},
    },
    TRAP_VOCAB,
)


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("length, alpha, expected", [
    (1, 0.6, 1.0),                  # (6/6)^α: one token is not penalised
    (7, 0.6, 1.5157165665103982),   # (12/6)^0.6 = 2^0.6
    (25, 0.6, 2.6265278044037674),  # (30/6)^0.6 = 5^0.6
    (13, 1.0, 3.0),                 # (18/6)^1
    (40, 0.0, 1.0),                 # α = 0: no penalty at any length
])
def test_length_penalty_matches_hand_values(length, alpha, expected):
    assert_allclose(float(length_penalty(length, alpha)), expected, rtol=1e-6)


def test_beam_search_finds_the_brute_force_best_that_greedy_misses():
    max_length, alpha = 5, 0.6
    fn, cache = markov_fn(TRAP_TABLE[None]), markov_cache([0])
    expected_seq, expected_score = brute_force_best(
        markov_logp(TRAP_TABLE), TRAP_VOCAB, max_length, alpha
    )
    assert list(expected_seq) == [3, 4, EOS, PAD, PAD]

    greedy = greedy_search(fn, cache, batch_size=1, max_length=max_length)
    assert list(np.asarray(greedy[0])) == [2, EOS, PAD, PAD, PAD]

    for beam_size in (2, 3):
        seqs, scores = beam_search(
            fn, cache, batch_size=1, beam_size=beam_size, max_length=max_length, alpha=alpha
        )
        assert_array_equal(seqs[0], expected_seq)
        assert_allclose(float(scores[0]), expected_score, atol=1e-5)


@pytest.mark.parametrize("unroll, calls_made", [(1, 3), (2, 4), (3, 3)])
def test_beam_search_terminates_early(unroll, calls_made):
    """After 3 steps the finished set {[3 4 EOS], [2 EOS]} beats the bound on every live one.
    With 2 steps per iteration of the loop, the second iteration's second step runs and is
    discarded: 4 calls of the model; with 1 or 3, exactly 3."""
    calls = []

    def counting_fn(ids_R1, cache):
        jax.debug.callback(lambda: calls.append(1))
        return markov_fn(TRAP_TABLE[None])(ids_R1, cache)

    seqs, _ = beam_search(counting_fn, markov_cache([0]), batch_size=1, beam_size=2,
                          max_length=10, alpha=0.6, unroll=unroll)
    jax.effects_barrier()
    assert list(np.asarray(seqs[0])) == [3, 4, EOS] + [PAD] * 7
    assert len(calls) == calls_made


@pytest.mark.parametrize("max_length, one_never_ends, steps", [
    (1, True, 1), (4, True, 4), (5, True, 5), (12, False, 9)])
def test_steps_per_loop_iteration_change_nothing_but_the_loop(max_length, one_never_ends,
                                                              steps):
    """1, 2 or 3 search steps per iteration of the loop: the same K hypotheses and scores,
    where the search runs to `max_length` (even and odd; an example that cannot end keeps it
    going) and where it stops early (after 9 steps of 12), examples finishing apart."""
    tables = random_tables(seed=11, examples=4, vocab=7, eos_boost=2.5)
    if one_never_ends:
        tables[1, :, EOS] = NEVER
    calls = []

    def counting_fn(ids_R1, cache):
        jax.debug.callback(lambda: calls.append(1))
        return markov_fn(tables)(ids_R1, cache)

    searches = {unroll: beam_search(counting_fn, markov_cache(np.arange(4)), batch_size=4,
                                    beam_size=3, max_length=max_length, alpha=0.6,
                                    return_all=True, unroll=unroll)
                for unroll in (1, 2, 3)}
    jax.effects_barrier()
    assert len(calls) == steps + 2 * -(-steps // 2) + 3 * -(-steps // 3)  # whole iterations
    seqs, scores = searches[1]
    assert np.isfinite(np.asarray(scores)).all()
    for unroll in (2, 3):
        assert_array_equal(searches[unroll][0], seqs)
        assert_array_equal(searches[unroll][1], scores)


@pytest.mark.parametrize("settings, message", [
    (dict(unroll=0), "unroll must be a positive integer, got 0"),
    (dict(unroll=2.0), "unroll must be a positive integer, got 2.0"),
    (dict(alpha=-0.5), "alpha must be a finite number >= 0, got -0.5"),
    (dict(alpha=float("nan")), "alpha must be a finite number >= 0, got nan"),
    (dict(alpha="0.6"), "alpha must be a finite number >= 0, got '0.6'"),
    (dict(eos_id="1"), "eos_id must be a positive integer, got '1'"),
    (dict(eos_id=0), "eos_id must be a positive integer, got 0"),
    (dict(eos_id=TRAP_VOCAB), f"eos_id={TRAP_VOCAB} is past the vocabulary of "
                              f"tokens_to_logits's {TRAP_VOCAB} logits: no row would ever end")])
def test_an_unroll_or_a_length_penalty_it_cannot_use_is_refused(settings, message):
    """α < 0 would let lp fall with length, so the early stop's bound, max live log P over
    lp(max_length), would no longer bound the live hypotheses; α as text failed deep in
    `length_penalty`, and an unroll of 2.0 in the loop's body. An EOS id given as text
    equalled no token (rows that never ended), as does one past the vocabulary, and 0 is
    the padding written after EOS; greedy search refuses them too."""
    with pytest.raises(ValueError) as caught:
        beam_search(markov_fn(TRAP_TABLE[None]), markov_cache([0]), batch_size=1, beam_size=2,
                    max_length=4, **{"alpha": 0.6, **settings})
    assert str(caught.value).splitlines()[0] == message  # then JAX's note, raised in a loop
    if "eos_id" in settings:
        with pytest.raises(ValueError, match=f"^{message}($|\n)"):
            greedy_search(markov_fn(TRAP_TABLE[None]), markov_cache([0]), batch_size=1,
                          max_length=4, eos_id=settings["eos_id"])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_size_one_equals_greedy(alpha):
    tables = random_tables(seed=1, examples=6, vocab=7, eos_boost=1.0)
    fn, cache = markov_fn(tables), markov_cache(np.arange(6))
    greedy = greedy_search(fn, cache, batch_size=6, max_length=9)
    seqs, _ = beam_search(fn, cache, batch_size=6, beam_size=1, max_length=9, alpha=alpha)
    assert_array_equal(seqs, greedy)
    assert np.any(np.asarray(greedy) == EOS) and np.any(np.all(np.asarray(greedy) != EOS, 1))


def test_batch_equals_each_example_alone():
    tables = random_tables(seed=2, examples=4, vocab=7, eos_boost=0.5)
    fn = markov_fn(tables)
    search = partial(beam_search, fn, beam_size=3, max_length=8, alpha=0.6, return_all=True)
    seqs, scores = search(markov_cache(np.arange(4)), batch_size=4)
    greedy = greedy_search(fn, markov_cache(np.arange(4)), batch_size=4, max_length=8)
    for e in range(4):
        alone_seqs, alone_scores = search(markov_cache([e]), batch_size=1)
        assert_array_equal(seqs[e], alone_seqs[0])
        assert_allclose(scores[e], alone_scores[0], rtol=1e-6)
        alone_greedy = greedy_search(fn, markov_cache([e]), batch_size=1, max_length=8)
        assert_array_equal(greedy[e], alone_greedy[0])


def test_after_eos_only_padding_and_scores_follow_the_formula():
    tables = random_tables(seed=3, examples=5, vocab=6, eos_boost=1.5)
    max_length, alpha = 7, 0.6
    seqs, scores, greedy = search_all(tables, beam_size=3, max_length=max_length, alpha=alpha)
    rows = np.concatenate([seqs.reshape(-1, max_length), greedy])
    assert np.mean([EOS in row for row in rows]) > 0.5
    for row in rows:  # ended: tokens, EOS, padding; or max_length tokens, no EOS
        end = list(row).index(EOS) if EOS in row else max_length
        assert np.all(row[:end] > EOS) and np.all(row[end + 1 :] == PAD), row
    for e in range(5):
        for k in range(3):
            expected = sequence_score(markov_logp(tables[e]), seqs[e, k], alpha, max_length)
            assert_allclose(float(scores[e, k]), expected, atol=1e-5)


def test_without_eos_the_best_live_hypothesis_fills_max_length():
    tables = random_tables(seed=4, examples=3, vocab=6)
    tables[:, :, EOS] = NEVER
    max_length, alpha = 6, 0.6
    seqs, scores, greedy = search_all(tables, beam_size=3, max_length=max_length, alpha=alpha)
    assert np.all(seqs > EOS) and np.all(greedy > EOS)
    assert np.all(np.diff(scores, axis=1) <= 0)
    for e in range(3):
        for k in range(3):  # live hypotheses are scored with lp(max_length)
            expected = sequence_score(markov_logp(tables[e]), seqs[e, k], alpha, max_length)
            assert_allclose(float(scores[e, k]), expected, atol=1e-5)


# The next-token distribution depends on the first generated token, read from the cache's
# history, and the best beam switches parent: after step 1 the live beams are [3 4] (from
# slot 1) and [2 4] (from slot 0), and [3 4] ends with P(EOS) = .9 only if the cache was
# reordered with it (the history of [2 4] gives .1).
HISTORY_VOCAB = 6
_AFTER_FIRST = {  # first generated token -> {prev: {next: p}}
    PAD: {PAD: {EOS: 0.02, 2: 0.55, 3: 0.4}},
    2: {2: {EOS: 0.05, 2: 0.2, 3: 0.2, 4: 0.3, 5: 0.25}, 4: {EOS: 0.1}},
    3: {3: {4: 0.9}, 4: {EOS: 0.9}},
}
HISTORY_TABLES = np.stack(
    [probability_rows(_AFTER_FIRST.get(first, {}), HISTORY_VOCAB) for first in range(6)]
)


def history_fn(ids_R1, cache):
    """Fake model reading the whole prefix from a cache of emitted tokens `(R, T + 1)`."""
    history_RT, step_R = cache
    rows_R = jnp.arange(history_RT.shape[0])
    history_RT = history_RT.at[rows_R, step_R].set(ids_R1[:, 0])
    first_R = jnp.where(step_R >= 1, history_RT[:, 1], PAD)
    logits_RV = jnp.asarray(HISTORY_TABLES, jnp.float32)[first_R, ids_R1[:, 0]]
    return logits_RV, (history_RT, step_R + 1)


def history_logp(prefix):
    first = prefix[0] if prefix else PAD
    prev = prefix[-1] if prefix else PAD
    return log_softmax_np(HISTORY_TABLES[first, prev])


def test_cache_is_reordered_with_the_beams():
    max_length, alpha = 4, 0.6
    cache = (jnp.zeros((1, max_length + 1), jnp.int32), jnp.zeros((1,), jnp.int32))
    seqs, scores = beam_search(
        history_fn, cache, batch_size=1, beam_size=2, max_length=max_length, alpha=alpha
    )
    expected_seq, expected_score = brute_force_best(
        history_logp, HISTORY_VOCAB, max_length, alpha
    )
    assert list(expected_seq) == [3, 4, EOS, PAD]
    assert_array_equal(seqs[0], expected_seq)
    assert_allclose(float(scores[0]), expected_score, atol=1e-5)


def test_per_example_state_is_read_by_every_beam_unrepeated():
    """The Markov tables as per-example state (`PerExample`, B rows) give the search of the
    same tables repeated per beam and reordered with them: the same hypotheses and scores.
    The callback sees B rows of the table and B·K ids, rows b·K .. b·K + K-1 example b's."""
    tables = random_tables(seed=5, examples=3, vocab=7, eos_boost=0.5)
    seen = []

    def shared_fn(ids_R1, cache):
        tables_BVV = cache["tables"].value
        seen.append((tables_BVV.shape[0], ids_R1.shape[0]))
        beams = ids_R1.shape[0] // tables_BVV.shape[0]
        return jnp.repeat(tables_BVV, beams, axis=0)[jnp.arange(ids_R1.shape[0]),
                                                     ids_R1[:, 0]], cache

    search = partial(beam_search, batch_size=3, beam_size=4, max_length=8, alpha=0.6,
                     return_all=True)
    seqs, scores = search(shared_fn, {"tables": PerExample(jnp.asarray(tables, jnp.float32))})
    expected_seqs, expected_scores = search(markov_fn(tables), markov_cache(np.arange(3)))
    assert seen == [(3, 12)] * UNROLL  # traced once per step of the loop's body
    assert_array_equal(seqs, expected_seqs)
    assert_allclose(scores, expected_scores, rtol=1e-6)
    greedy = greedy_search(shared_fn, {"tables": PerExample(jnp.asarray(tables, jnp.float32))},
                           batch_size=3, max_length=8)
    assert_array_equal(greedy, greedy_search(markov_fn(tables), markov_cache(np.arange(3)),
                                             batch_size=3, max_length=8))


def test_alpha_and_eos_traced_by_a_jitted_caller_search_as_given():
    """A jitted caller's α and EOS id have no value to check: they are used as they are
    (the length penalty's arithmetic, the comparison with each token), as before the
    checks of known values."""
    tables = random_tables(seed=6, examples=3, vocab=7, eos_boost=0.5)
    fn, cache = markov_fn(tables), markov_cache(np.arange(3))

    @jax.jit
    def searches(alpha, eos_id):
        beam = beam_search(fn, cache, batch_size=3, beam_size=2, max_length=6, alpha=alpha,
                           eos_id=eos_id)
        return beam, greedy_search(fn, cache, batch_size=3, max_length=6, eos_id=eos_id)

    (seqs, scores), greedy = searches(0.6, EOS)
    assert np.any(np.asarray(seqs) == EOS)
    expected = beam_search(fn, cache, batch_size=3, beam_size=2, max_length=6, alpha=0.6)
    assert_array_equal(seqs, expected[0])
    assert_allclose(scores, expected[1], rtol=1e-6)
    assert_array_equal(greedy, greedy_search(fn, cache, batch_size=3, max_length=6))


def test_greedy_search_threads_a_callers_state_of_any_shape():
    """Greedy search does not repeat or reorder its state, so a caller's may hold arrays
    whose leading axis is not the batch (here the (V, V) table itself, beside (B,) rows)."""
    tables = random_tables(seed=7, examples=1, vocab=7, eos_boost=0.5)
    table_VV = jnp.asarray(tables[0], jnp.float32)

    def fn(ids_B1, cache):
        return cache["table"][ids_B1[:, 0]], cache

    state = {"table": table_VV, "rows": jnp.zeros((3,), jnp.int32)}
    expected = greedy_search(markov_fn(tables), markov_cache([0, 0, 0]), batch_size=3,
                             max_length=6)
    assert_array_equal(greedy_search(fn, state, batch_size=3, max_length=6), expected)


def test_jit_compiles_once_per_shape_and_matches_eager():
    traces = []

    @jax.jit
    def decode(tables, examples):
        traces.append(1)
        return beam_search(
            markov_fn(tables), markov_cache(examples), batch_size=3, beam_size=4, max_length=8,
            alpha=0.6)

    tables = [random_tables(seed=s, examples=3, vocab=7, eos_boost=0.5) for s in (5, 6)]
    for t in tables:
        jitted = decode(t, np.arange(3))
        eager = beam_search(
            markov_fn(t), markov_cache(np.arange(3)), batch_size=3, beam_size=4, max_length=8,
            alpha=0.6)
        assert_array_equal(jitted[0], eager[0])
        assert_allclose(jitted[1], eager[1], rtol=1e-6)
    assert len(traces) == 1


def test_return_all_is_sorted_and_its_best_is_the_default_answer():
    tables = random_tables(seed=7, examples=3, vocab=7, eos_boost=1.0)
    fn, cache = markov_fn(tables), markov_cache(np.arange(3))
    search = partial(beam_search, fn, cache, batch_size=3, beam_size=3, max_length=8, alpha=0.6)
    all_seqs, all_scores = search(return_all=True)
    best_seqs, best_scores = search()
    assert all_seqs.shape == (3, 3, 8) and all_scores.shape == (3, 3)
    assert np.all(np.isfinite(np.asarray(all_scores)))
    assert np.all(np.diff(np.asarray(all_scores), axis=1) <= 0)
    assert_array_equal(all_seqs[:, 0], best_seqs)
    assert_allclose(all_scores[:, 0], best_scores)
    ended_BK = np.any(np.asarray(all_seqs) == EOS, axis=-1)
    assert np.all(np.diff(ended_BK.astype(int), axis=1) <= 0)  # finished ones first
    assert np.any(ended_BK[:, 0]) and not np.all(ended_BK)  # live ones fill empty slots
    for e in range(3):
        assert len({tuple(np.asarray(row)) for row in all_seqs[e]}) == 3


# ---------------------------------------------------------------- one step's selection


def flat_top_k_np(live_logp_BK, logits_BKV):
    """The K best of all K·V extensions, ranked in NumPy: (log P desc, beam, token)."""
    batch, k, vocab = logits_BKV.shape
    x = np.asarray(logits_BKV, np.float32)
    shifted = x - x.max(axis=-1, keepdims=True)  # jax.nn.log_softmax's float32 arithmetic
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    candidates_BKV = np.asarray(live_logp_BK, np.float32)[:, :, None] + logp
    out = []
    for row_KV in candidates_BKV:
        order = sorted(itertools.product(range(k), range(vocab)),
                       key=lambda bt: (-row_KV[bt], bt))[:k]
        out.append([(row_KV[bt], *bt) for bt in order])
    logp_BK, parent_BK, token_BK = np.moveaxis(np.array(out), -1, 0)
    return logp_BK, parent_BK.astype(int), token_BK.astype(int)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("ties", [False, True])
def test_one_steps_extensions_are_the_k_best_of_all_k_times_v(dtype, ties):
    # Per beam top-K, then top-K of the K·K (decoding._best_extensions) against a ranking of
    # every one of the K·V candidates; integer logits and beam scores make ties.
    from transformer_jax.decoding import _best_extensions

    rng = np.random.default_rng(3 + ties)
    batch, k, vocab = 5, 4, 11
    if ties:
        logits = rng.integers(-2, 2, (batch, k, vocab)).astype(np.float32)
        live = rng.integers(-2, 0, (batch, k)).astype(np.float32)
        logits[0, 1] = logits[0, 0]  # two beams with the same row and score: all tied
        live[0, 1] = live[0, 0]
    else:
        logits = rng.normal(size=(batch, k, vocab)).astype(np.float32) * 3
        live = rng.normal(size=(batch, k)).astype(np.float32)
    live[2, 1:] = -np.inf  # one live beam (as at step 0), three empty slots
    logits = np.asarray(jnp.asarray(logits, dtype).astype(jnp.float32))  # the dtype's values
    want = flat_top_k_np(live, logits)
    got = jax.jit(_best_extensions)(jnp.asarray(live), jnp.asarray(logits, dtype))
    assert_allclose(got[0], want[0], rtol=1e-6)
    assert_array_equal(got[1], want[1])
    assert_array_equal(got[2], want[2])


def test_beam_size_larger_than_the_vocabulary_is_refused():
    tables = random_tables(seed=1, examples=1, vocab=3)
    with pytest.raises(ValueError, match="beam_size 4 is larger than the vocabulary"):
        beam_search(markov_fn(tables), markov_cache([0]), batch_size=1, beam_size=4,
                    max_length=5, alpha=0.6)


def _run(search, tokens_to_logits, batch_size=2):
    if search == "greedy":
        return greedy_search(tokens_to_logits, jnp.zeros((batch_size,)), batch_size=batch_size,
                             max_length=3)
    return beam_search(tokens_to_logits, jnp.zeros((batch_size,)), batch_size=batch_size,
                       beam_size=2, max_length=3, alpha=0.6)[0]


@pytest.mark.parametrize("search, rows", [("greedy", 2), ("beam", 4)])
@pytest.mark.parametrize("shape, why", [
    (lambda r: (r, 2, 5), "a length axis of 2: its 10 logits were read as one row of 10 ids"),
    (lambda r: (5, r), "(V, R): R·V elements, but another row's logits in each"),
    (lambda r: (1, r * 5), "one row: reshaped to (R, V), each row took others' logits"),
])
def test_logits_of_another_shape_are_refused_in_one_line(search, rows, shape, why):
    """The searches reshaped whatever came back to (R, V): logits of (R, 2, V) gave ids
    past the vocabulary ("8" with V = 5) without an error. Now any shape but (R, V) and
    (R, 1, V) is named, with the R the search expected."""
    def logits(ids, cache):
        return jnp.zeros(shape(ids.shape[0])), cache

    with pytest.raises(ValueError) as error:
        _run(search, logits)
    assert str(error.value) == (f"tokens_to_logits must return logits of shape (R, V) or "
                                f"(R, 1, V) with R = {rows} rows, one per row of ids; got "
                                f"{shape(rows)}"), why


@pytest.mark.parametrize("search, rows", [("greedy", 2), ("beam", 4)])
def test_a_callback_that_returns_its_logits_alone_is_refused(search, rows):
    """Forgetting the cache: beam search unpacked a (R, 2) array into two rows and ran on."""
    with pytest.raises(TypeError) as error:
        _run(search, lambda ids, cache: jnp.zeros((ids.shape[0], 2)))
    assert str(error.value) == ("tokens_to_logits must return (logits, cache), got an array "
                                f"of shape ({rows}, 2)")


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_logits_with_or_without_a_length_axis_search_alike(search):
    """(R, V) and (R, 1, V) are the two shapes the module docstring allows, and give one
    search; token 3 is the best at every step, EOS (1) never."""
    def logits_RV(ids, cache):
        return jnp.zeros((ids.shape[0], 5)).at[:, 3].set(2.0), cache

    def logits_R1V(ids, cache):
        return logits_RV(ids, cache)[0][:, None], cache

    assert_array_equal(_run(search, logits_RV), [[3, 3, 3], [3, 3, 3]])
    assert_array_equal(_run(search, logits_R1V), [[3, 3, 3], [3, 3, 3]])


def test_another_eos_id_ends_hypotheses_as_the_default_one_does():
    """The tables with tokens 1 and 3 swapped, searched with eos_id=3, give the hypotheses of
    the original tables with EOS 1, relabelled, and the same scores: the searches end rows on
    the id they are given, not on token_ids.EOS_ID."""
    tables = random_tables(seed=8, examples=3, vocab=7, eos_boost=1.5)
    swap = np.array([0, 3, 2, 1, 4, 5, 6])  # its own inverse
    swapped = tables[:, swap][:, :, swap]
    search = partial(beam_search, batch_size=3, beam_size=3, max_length=7, alpha=0.6,
                     return_all=True)
    cache = markov_cache(np.arange(3))
    seqs, scores = search(markov_fn(tables), cache)
    assert np.any(np.asarray(seqs) == EOS)
    swapped_seqs, swapped_scores = search(markov_fn(swapped), cache, eos_id=3)
    assert_array_equal(swap[np.asarray(swapped_seqs)], seqs)
    assert_allclose(swapped_scores, scores, rtol=1e-6)
    greedy = greedy_search(markov_fn(tables), cache, batch_size=3, max_length=7)
    assert np.any(np.asarray(greedy) == EOS)
    swapped_greedy = greedy_search(markov_fn(swapped), cache, batch_size=3, max_length=7,
                                   eos_id=3)
    assert_array_equal(swap[np.asarray(swapped_greedy)], greedy)


def test_a_later_hypothesis_of_the_same_score_leaves_the_earlier_first():
    """With α = 0, [2 EOS] (finished at step 2) and [3 4 EOS] (at step 3) have the same
    log P to the bit: the first token halves it, every later one is certain (its log-softmax
    exactly 0). The finished set keeps the older of tied scores first, so the earlier,
    shorter hypothesis is the answer."""
    vocab = 5
    table = np.full((vocab, vocab), NEVER, np.float32)
    table[PAD, [2, 3]] = 0.0  # log P = -log 2 each
    table[2, EOS] = table[3, 4] = table[4, EOS] = 0.0  # log P = 0
    seqs, scores = beam_search(markov_fn(table[None]), markov_cache([0]), batch_size=1,
                               beam_size=2, max_length=4, alpha=0.0, return_all=True)
    assert_array_equal(seqs[0], [[2, EOS, PAD, PAD], [3, 4, EOS, PAD]])
    assert_array_equal(scores[0], [-np.log(np.float32(2))] * 2)
