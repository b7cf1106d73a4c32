"""Greedy and beam search (§6.1) over a `tokens_to_logits` callback.

Pure JAX: the search never imports the model. The caller closes the model
over one callback,

    tokens_to_logits(ids_R1, cache) -> (logits_RV, cache)

which reads the previous token of every row (`(R, 1)` int32; the first call
gets `DECODER_START_ID`, 0, the decoder's shifted-right start symbol) and
returns the logits of the next one (`(R, V)`; a length axis of 1, `(R, 1, V)`,
is accepted too), with its own state (key/value cache, position counter,
encoder memory, ...) threaded through `lax.while_loop` unchanged in shape. R
counts the search's rows: B in greedy search, B·K in beam search. Beam search
repeats the state K times per example and reorders it by the chosen beams, except
the parts wrapped in `PerExample`.

Greedy search traces its step once, beam search `unroll` times (2 by default,
to spare XLA a copy of the cache every step): wrap the call in `jax.jit` (sizes
static) and it compiles once per input shape. The paper's setting is
`beam_search(..., beam_size=4, alpha=0.6)` with `max_length` = input length
+ 50 (`predict` takes a batch's padded length for all its rows, as tensor2tensor
does). Sequences hold generated tokens only: EOS included, 0 (padding) after.
"""

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from transformer_jax.argument_checks import finite_number, positive_int
from transformer_jax.token_ids import DECODER_START_ID, EOS_ID, PAD_ID

TokensToLogits = Callable[[jax.Array, Any], tuple[jax.Array, Any]]

_NEG_INF = float("-inf")
UNROLL = 2  # beam search steps per iteration of its loop: see `beam_search`


class PerExample(NamedTuple):
    """Part of a search's state that every beam of an example reads and no step changes
    (the encoder-decoder keys and values): beam search neither repeats it K times nor
    reorders it, so `tokens_to_logits` gets it with B rows while its ids have B·K, rows
    b·K .. b·K + K-1 being example b's beams (greedy search: B and B)."""

    value: Any


def _per_beam(fn: Callable[[jax.Array], jax.Array], state):
    """`fn` on every array of `state` except those inside a `PerExample`."""
    return jax.tree.map(lambda x: x if isinstance(x, PerExample) else fn(x), state,
                        is_leaf=lambda x: isinstance(x, PerExample))


def length_penalty(length, alpha: float) -> jax.Array:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016). The paper gives
    only α = 0.6 (§6.1, "length penalty α = 0.6"); the formula is GNMT's, which
    tensor2tensor's beam search uses.

    A hypothesis scores log P(Y) / lp(Y); |Y| counts generated tokens, EOS
    included, so a one-token hypothesis has lp = 1.
    """
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _check_search(cache, batch_size, max_length, beam_size=None, *, eos_id) -> tuple:
    """(batch_size, max_length, beam_size) as Python ints (beam_size None for greedy search),
    or one-line errors, before anything is traced, for sizes that would otherwise fail deep
    in JAX or, past the end of a model's cache, silently overwrite its last slot; and the
    rows of the cache's arrays that must have B: in beam search those it repeats, in greedy
    search those of the model's cache (a caller's state it threads through as it is). A
    known `eos_id` is a positive integer: 0 is the padding the searches write after EOS
    (`token_ids.PAD_ID`)."""
    _unless_traced(positive_int, "eos_id", eos_id)  # "1" equalled no token: rows never ended
    batch_size, max_length = (positive_int("batch_size", batch_size),
                              positive_int("max_length", max_length))
    if beam_size is not None:  # greedy search has none
        beam_size = positive_int("beam_size", beam_size)
    capacity = getattr(cache, "cache_length", None)  # the model's DecodingCache has one
    if capacity is not None and max_length > capacity:
        raise ValueError(f"max_length={max_length} is more than the cache's {capacity} "
                         f"positions; make it with init_cache(..., max_length={max_length})")
    if beam_size is not None:
        leaves = [x for x in jax.tree.leaves(cache, is_leaf=lambda x: isinstance(x, PerExample))
                  if not isinstance(x, PerExample)]
    else:
        leaves = jax.tree.leaves(cache) if capacity is not None else []
    rows = {jnp.shape(x)[0] for x in leaves if jnp.ndim(x) >= 1}
    if rows - {batch_size}:
        raise ValueError(f"batch_size={batch_size}, but the cache's arrays have "
                         f"{', '.join(map(str, sorted(rows)))} rows (their leading axis)")
    return batch_size, max_length, beam_size


def _unless_traced(check, name: str, value):
    """`check(name, value)` where `value` is known; a value traced by a jitted caller is only
    used in arithmetic here, so it is taken as it is."""
    return value if isinstance(value, jax.core.Tracer) else check(name, value)


def _next_logits(tokens_to_logits: TokensToLogits, ids_R1, cache, *, eos_id):
    """`tokens_to_logits(ids_R1, cache)` as `(logits_RV, cache)`, or a one-line error where
    it returns no (logits, cache) pair or logits of another shape than `(R, V)` or
    `(R, 1, V)`: the searches' reshapes would take any array of R·V elements, and give
    ids past the vocabulary or another row's tokens; or where a known `eos_id` is past the
    vocabulary (no row would end)."""
    returned = tokens_to_logits(ids_R1, cache)
    if not (isinstance(returned, tuple | list) and len(returned) == 2):
        got = (f"an array of shape {returned.shape}" if hasattr(returned, "shape")
               else type(returned).__name__)
        raise TypeError(f"tokens_to_logits must return (logits, cache), got {got}")
    logits, cache = returned
    rows, shape = ids_R1.shape[0], jnp.shape(logits)
    if not (len(shape) in (2, 3) and shape[0] == rows and (len(shape) == 2 or shape[1] == 1)):
        raise ValueError(f"tokens_to_logits must return logits of shape (R, V) or (R, 1, V) "
                         f"with R = {rows} rows, one per row of ids; got {shape}")
    if isinstance(eos_id, numbers.Integral) and eos_id >= shape[-1]:
        raise ValueError(f"eos_id={eos_id} is past the vocabulary of tokens_to_logits's "
                         f"{shape[-1]} logits: no row would ever end")
    return jnp.reshape(logits, (rows, shape[-1])), cache


def _previous_tokens(seqs, step):
    """The token generated at `step - 1` (last axis), or the decoder's start symbol at step 0."""
    last = lax.dynamic_index_in_dim(seqs, jnp.maximum(step - 1, 0), axis=-1, keepdims=False)
    return jnp.where(step > 0, last, DECODER_START_ID)


def greedy_search(
    tokens_to_logits: TokensToLogits,
    cache,
    *,
    batch_size: int,
    max_length: int,
    eos_id: int = EOS_ID,
) -> jax.Array:
    """The most likely next token at every step: sequences `(B, max_length)` int32.

    A row that has emitted EOS is padded with 0 (and still fed to the model, as
    0); the loop stops when every row has ended or after `max_length` tokens.
    """

    batch_size, max_length, _ = _check_search(cache, batch_size, max_length, eos_id=eos_id)

    def not_done(state):
        step, _, ended_B, _ = state
        return (step < max_length) & ~jnp.all(ended_B)

    @jax.named_scope("search")  # its operations, apart from the model's, in profiles
    def advance(state):
        step, seqs_BT, ended_B, cache = state
        ids_B1 = _previous_tokens(seqs_BT, step)[:, None]
        logits_BV, cache = _next_logits(tokens_to_logits, ids_B1, cache, eos_id=eos_id)
        next_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        next_B = jnp.where(ended_B, PAD_ID, next_B)
        seqs_BT = seqs_BT.at[:, step].set(next_B)
        return step + 1, seqs_BT, ended_B | (next_B == eos_id), cache

    state = (
        jnp.int32(0),
        jnp.full((batch_size, max_length), PAD_ID, jnp.int32),
        jnp.zeros((batch_size,), bool),
        cache,
    )
    return lax.while_loop(not_done, advance, state)[1]


class _BeamState(NamedTuple):
    step: jax.Array  # () int32: tokens generated so far
    live_seqs_BKT: jax.Array  # int32; EOS only in empty slots (left by a finished one)
    live_logp_BK: jax.Array  # float32 log P(Y); -inf marks an empty slot
    finished_seqs_BKT: jax.Array  # int32: ..., EOS, 0, 0
    finished_scores_BK: jax.Array  # float32 log P(Y) / lp(Y), best first; -inf where empty
    finished_BK: jax.Array  # bool: the slot holds a finished hypothesis
    cache: Any  # the caller's, every leaf with leading axis B·K


def beam_search(
    tokens_to_logits: TokensToLogits,
    cache,
    *,
    batch_size: int,
    beam_size: int,
    max_length: int,
    alpha: float,
    eos_id: int = EOS_ID,
    return_all: bool = False,
    unroll: int = UNROLL,
):
    """Beam search with the GNMT length penalty (§6.1): best `(sequences, scores)`.

    Returns sequences `(B, max_length)` int32 and scores `(B,)` float32 of the
    best finished hypothesis of every example, or, with `return_all`, all K
    `(B, K, max_length)` and `(B, K)`, best first. Slots that no finished
    hypothesis filled (all K where none finished) take the best live ones,
    ranked after the finished: no EOS, `max_length` tokens, lp(max_length).
    Score = log P(Y) / length_penalty(|Y|, alpha), log P from float32
    log_softmax of the logits.

    `cache` is the caller's for batch B: every leaf must have the batch as its
    leading axis. It is repeated K times per example (rows b·K .. b·K + K-1)
    and, after each step, gathered along that axis by the chosen parent beams;
    the parts wrapped in `PerExample` are neither (B rows throughout).

    One step, as a state machine over live and finished sets of K slots each:
    the K best of the K·V extensions of the live hypotheses are taken; those
    ending in EOS join the finished set (which keeps the K best scores) and
    leave an empty live slot (-inf) for one step, the others stay live.
    Differs from tensor2tensor and flax, which draw 2K candidates to keep K
    live (and finish EOS candidates that are not in the top K): here an EOS
    counts only when it is among the K best, so beam size 1 is exactly greedy.

    Early termination, per example: log-probabilities only fall as tokens are
    added and lp grows with length (α >= 0), so no live hypothesis can score
    above  max(live log P) / lp(max_length).  An example is done when all K
    finished slots are filled and its worst finished score is at least that
    bound, or when no live hypothesis is left. Done examples are frozen; the
    loop stops when all are done or after `max_length` tokens.

    `unroll` steps run per iteration of the loop (`_unrolled_while_loop`: with 2 or more
    XLA copies no cache back every step); the results are the same for any `unroll`, and
    the body traces `tokens_to_logits` `unroll` times. Beam 4 of base at 2 against 1: 1.16 ×
    on the 2-core CPU; on an H200 1.05 × in float32 and 0.96-0.99 × in bfloat16
    (BENCHMARKS.md, "GPU: H200, 2026-11-27").
    """
    unroll = positive_int("unroll", unroll)
    # α < 0 would make lp fall with length, and the early stop's bound above would not hold.
    alpha = _unless_traced(finite_number, "alpha", alpha)
    batch_size, max_length, beam_size = _check_search(cache, batch_size, max_length, beam_size,
                                                      eos_id=eos_id)
    state = _initial_state(cache, batch_size, beam_size, max_length)
    max_penalty = length_penalty(max_length, alpha)

    def not_done(state):
        return (state.step < max_length) & ~jnp.all(_done_B(state, max_penalty))

    @jax.named_scope("search")  # its operations, apart from the model's, in profiles
    def advance(state):
        new = _beam_step(tokens_to_logits, state, alpha=alpha, eos_id=eos_id)
        done_B = _done_B(state, max_penalty)
        return new._replace(**{f: _freeze(done_B, state, new, f) for f in _SEARCH_FIELDS})

    state = _unrolled_while_loop(not_done, advance, state, unroll)
    seqs_BKT, scores_BK = _final_hypotheses(state, alpha)
    if return_all:
        return seqs_BKT, scores_BK
    return seqs_BKT[:, 0], scores_BK[:, 0]


def _initial_state(cache, batch_size: int, k: int, max_length: int) -> _BeamState:
    """No hypothesis yet: the caller's `cache` repeated K times per example (but its
    `PerExample` parts)."""
    # The K slots start as the same empty prefix: one live, or step 0 would pick K copies.
    live_logp_1K = jnp.where(jnp.arange(k) == 0, 0.0, _NEG_INF)[None, :]
    return _BeamState(
        step=jnp.int32(0),
        live_seqs_BKT=jnp.full((batch_size, k, max_length), PAD_ID, jnp.int32),
        live_logp_BK=jnp.broadcast_to(live_logp_1K, (batch_size, k)).astype(jnp.float32),
        finished_seqs_BKT=jnp.full((batch_size, k, max_length), PAD_ID, jnp.int32),
        finished_scores_BK=jnp.full((batch_size, k), _NEG_INF, jnp.float32),
        finished_BK=jnp.zeros((batch_size, k), bool),
        cache=_per_beam(lambda x: jnp.repeat(x, k, axis=0), cache),
    )


def _unrolled_while_loop(not_done, advance, state: _BeamState, unroll: int) -> _BeamState:
    """`lax.while_loop(not_done, advance, state)` with `unroll` steps per iteration.

    A while loop keeps its state in place, and a gather cannot write over what it reads:
    with 1 step per iteration, XLA gathers each reordered cache leaf into a temporary and
    copies it back every step; with 2 or more, the last step of an iteration gathers from
    the previous step's temporary straight into the loop's buffer, and nothing is copied.
    The condition is checked once per `unroll` steps; steps past the end keep the search
    as it was (their cache, garbage, is not read again): up to `unroll - 1` are discarded.
    """
    def body(state):
        state = advance(state)
        for _ in range(unroll - 1):
            new, go = advance(state), not_done(state)
            state = new._replace(**{f: jnp.where(go, getattr(new, f), getattr(state, f))
                                    for f in ("step",) + _SEARCH_FIELDS})
        return state

    return lax.while_loop(not_done, body, state)


def _done_B(state: _BeamState, max_penalty) -> jax.Array:
    """Per example: no live hypothesis can enter the (full) finished set any more."""
    bound_B = jnp.max(state.live_logp_BK, axis=1) / max_penalty
    worst_finished_B = jnp.min(state.finished_scores_BK, axis=1)
    full_B = jnp.all(state.finished_BK, axis=1)
    no_live_B = jnp.all(state.live_logp_BK == _NEG_INF, axis=1)
    return no_live_B | (full_B & (worst_finished_B >= bound_B))


_SEARCH_FIELDS = (
    "live_seqs_BKT",
    "live_logp_BK",
    "finished_seqs_BKT",
    "finished_scores_BK",
    "finished_BK",
)


def _freeze(done_B, old: _BeamState, new: _BeamState, field: str):
    """`field` of `old` for done examples, of `new` for the others."""
    old_x, new_x = getattr(old, field), getattr(new, field)
    return jnp.where(done_B.reshape((-1,) + (1,) * (old_x.ndim - 1)), old_x, new_x)


def _beam_step(tokens_to_logits, state: _BeamState, *, alpha, eos_id) -> _BeamState:
    """Extend the live hypotheses by one token; update the live and finished sets."""
    batch, k = state.live_logp_BK.shape
    ids_BK = _previous_tokens(state.live_seqs_BKT, state.step)
    logits_RV, cache = _next_logits(tokens_to_logits, ids_BK.reshape(batch * k, 1),
                                    state.cache, eos_id=eos_id)
    top_logp_BK, parent_BK, token_BK = _best_extensions(
        state.live_logp_BK, logits_RV.reshape(batch, k, -1))
    seqs_BKT = jnp.take_along_axis(state.live_seqs_BKT, parent_BK[:, :, None], axis=1)
    seqs_BKT = seqs_BKT.at[:, :, state.step].set(token_BK)
    rows = (jnp.arange(batch)[:, None] * k + parent_BK).reshape(-1)
    cache = _per_beam(lambda x: jnp.take(x, rows, axis=0), cache)

    is_eos_BK = token_BK == eos_id
    ended_BK = is_eos_BK & (top_logp_BK > _NEG_INF)
    penalty = length_penalty(state.step + 1, alpha)
    new_scores_BK = jnp.where(ended_BK, top_logp_BK / penalty, _NEG_INF)
    scores_B2K = jnp.concatenate([state.finished_scores_BK, new_scores_BK], axis=1)
    seqs_B2KT = jnp.concatenate([state.finished_seqs_BKT, seqs_BKT], axis=1)
    flags_B2K = jnp.concatenate([state.finished_BK, ended_BK], axis=1)
    finished_scores_BK, keep_BK = lax.top_k(scores_B2K, k)  # ties keep the older
    return _BeamState(
        step=state.step + 1,
        live_seqs_BKT=seqs_BKT,
        live_logp_BK=jnp.where(is_eos_BK, _NEG_INF, top_logp_BK),
        finished_seqs_BKT=jnp.take_along_axis(seqs_B2KT, keep_BK[:, :, None], axis=1),
        finished_scores_BK=finished_scores_BK,
        finished_BK=jnp.take_along_axis(flags_B2K, keep_BK, axis=1),
        cache=cache,
    )


def _best_extensions(live_logp_BK, logits_BKV):
    """The K best of the K·V one-token extensions of the live hypotheses:
    `(log P, parent beam, token)`, each `(B, K)`, best first, ties to the lower beam,
    then the lower token (which tokens fill slots of log P -inf is unspecified).

    The K best overall are among each beam's K best tokens, since a beam adds one
    log P to all its extensions and log_softmax keeps each row's order. So the top-K
    runs per beam over V, then over those K·K, and float32 log-probabilities are
    computed for the K·K chosen logits only, not written for all K·V: the same
    arithmetic as `jax.nn.log_softmax`, (x - max) - log Σ exp(x - max), so the
    same values as a top-K over all K·V.
    """
    batch, k, vocab = logits_BKV.shape
    if vocab < k:
        raise ValueError(f"beam_size {k} is larger than the vocabulary ({vocab} logits per row)")
    x_BKV = logits_BKV.astype(jnp.float32)
    top_logits_BKK, token_BKK = lax.top_k(x_BKV, k)  # float32: XLA's CPU top-K of bfloat16 sorts
    max_BK1 = jnp.max(x_BKV, axis=-1, keepdims=True)
    log_sum_BK1 = jnp.log(jnp.sum(jnp.exp(x_BKV - max_BK1), axis=-1, keepdims=True))
    logp_BKK = (top_logits_BKK - max_BK1) - log_sum_BK1
    candidates_BKK = live_logp_BK[:, :, None] + logp_BKK
    top_logp_BK, flat_BK = lax.top_k(candidates_BKK.reshape(batch, k * k), k)
    token_BK = jnp.take_along_axis(token_BKK.reshape(batch, k * k), flat_BK, axis=1)
    return top_logp_BK, flat_BK // k, token_BK


def _final_hypotheses(state: _BeamState, alpha):
    """K hypotheses per example, best first: the finished ones, then the best live ones.

    Live hypotheses (no EOS) fill the slots the finished set left empty and
    score log P / lp(tokens generated); they never displace a finished one.
    """
    k = state.live_logp_BK.shape[1]
    live_scores_BK = state.live_logp_BK / length_penalty(state.step, alpha)
    live_scores_BK, order_BK = lax.top_k(live_scores_BK, k)
    live_seqs_BKT = jnp.take_along_axis(state.live_seqs_BKT, order_BK[:, :, None], axis=1)
    # Finished slots are sorted with the filled ones first: slot j takes finished j
    # while j < n, then live j - n.
    n_B1 = jnp.sum(state.finished_BK, axis=1, keepdims=True)
    slot_1K = jnp.arange(k)[None, :]
    pick_BK = jnp.where(slot_1K < n_B1, slot_1K, k + slot_1K - n_B1)
    seqs_B2KT = jnp.concatenate([state.finished_seqs_BKT, live_seqs_BKT], axis=1)
    scores_B2K = jnp.concatenate([state.finished_scores_BK, live_scores_BK], axis=1)
    return (
        jnp.take_along_axis(seqs_B2KT, pick_BK[:, :, None], axis=1),
        jnp.take_along_axis(scores_B2K, pick_BK, axis=1),
    )
