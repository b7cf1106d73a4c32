"""The searches driving the real model through its cache agree with the uncached decoder."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax.steps as steps_module
from transformer_jax.decoding import beam_search, greedy_search
from transformer_jax.model import Transformer, cast_matmul_params
from transformer_jax.model_config import get_model_config
from transformer_jax.steps import predict_step

CONFIG = get_model_config("tiny", vocab_size=30)
MAX_LENGTH = 7


def setup(config=CONFIG, seed=3):
    model = Transformer(config)
    inputs_BS = jnp.array([[5, 6, 7, 8, 0], [9, 3, 0, 0, 0], [4, 4, 4, 4, 4]])
    variables = model.init(jax.random.key(seed), inputs_BS, inputs_BS)
    memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    cache = model.apply(variables, memory_BSD, inputs_BS, MAX_LENGTH,
                        method=Transformer.init_cache)
    step = functools.partial(model.apply, variables, method=Transformer.decode_step)
    return model, variables, inputs_BS, cache, step


@pytest.fixture
def on_the_cpu():
    """The CPU as the default device, for the tests that compare differently compiled
    programs bit for bit or count the copies in one: on a GPU, XLA's fusions and autotuned
    kernels may round differently from one program to the next."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


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


@pytest.mark.usefixtures("on_the_cpu")  # the two greedy searches below: bit for bit
def test_searches_refuse_sizes_the_cache_cannot_hold():
    """A search longer than the model's cache (whose last slot it would overwrite at every
    step past the end, silently), a batch other than the cache's, and sizes
    below 1: one ValueError each, before anything is traced. A shorter search reads the
    cache as is."""
    _, _, _, cache, step = setup()
    assert cache.cache_length == MAX_LENGTH
    beam = functools.partial(beam_search, step, cache, alpha=0.6)
    greedy = functools.partial(greedy_search, step, cache)
    too_long = (f"max_length={MAX_LENGTH + 1} is more than the cache's {MAX_LENGTH} positions; "
                f"make it with init_cache(..., max_length={MAX_LENGTH + 1})")
    for search, sizes, message in [
            (greedy, dict(batch_size=3, max_length=MAX_LENGTH + 1), too_long),
            (beam, dict(batch_size=3, beam_size=4, max_length=MAX_LENGTH + 1), too_long),
            (beam, dict(batch_size=1, beam_size=2, max_length=3),
             "batch_size=1, but the cache's arrays have 3 rows (their leading axis)"),
            (greedy, dict(batch_size=2, max_length=3),
             "batch_size=2, but the cache's arrays have 3 rows (their leading axis)"),
            (beam, dict(batch_size=3, beam_size=0, max_length=3),
             "beam_size must be a positive integer, got 0"),
            (greedy, dict(batch_size=3, max_length=0), "max_length must be a positive integer, "
                                                       "got 0"),
            (greedy, dict(batch_size=3, max_length=2.0), "max_length must be a positive "
                                                         "integer, got 2.0")]:
        with pytest.raises(ValueError) as caught:
            search(**sizes)
        assert str(caught.value) == message
    short = greedy(batch_size=3, max_length=np.int64(MAX_LENGTH - 2))
    np.testing.assert_array_equal(short, greedy(batch_size=3, max_length=MAX_LENGTH)[:, :-2])
    # A concrete JAX integer is its number (it passed the check, then failed to hash).
    np.testing.assert_array_equal(beam(batch_size=jnp.int32(3), beam_size=jnp.int32(2),
                                       max_length=3)[0],
                                  beam(batch_size=3, beam_size=2, max_length=3)[0])


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


def test_sinusoidal_positions_bound_neither_sources_nor_outputs():
    """config.max_length is the rows of a learned position table; sinusoidal encodings have
    none, so a source longer than max_length is searched, padded to a multiple of 8 as any
    other, and its output runs to that length + max_extra_length."""
    from transformer_jax.predict import output_length, position_rows, predict

    config = get_model_config("tiny", vocab_size=30, max_length=12)
    assert config.positional_encoding == "sinusoidal"
    assert position_rows(config) is None and output_length(config, 16, 50) == 66
    model = Transformer(config)
    params = model.init(jax.random.key(4), jnp.ones((1, 4), jnp.int32),
                        jnp.ones((1, 4), jnp.int32))["params"]
    (output,) = predict(model, params, [[5] * 13 + [1]], beam_size=1, alpha=0.6,
                        max_extra_length=2)
    assert output.shape == (16 + 2,)


def test_a_batch_is_padded_to_its_longest_source_rounded_up_to_a_multiple_of_8():
    """predict pads a batch to its longest source rounded up to a multiple of 8 (BUCKET), not
    past it (8 stays 8: the exported buckets, of those lengths, give the same ids), and its
    outputs run to that length + max_extra_length; its rows to a power of two."""
    from transformer_jax.predict import BUCKET, _padded_batch, predict

    assert BUCKET == 8
    for longest, padded in [(1, 8), (7, 8), (8, 8), (9, 16), (16, 16), (17, 24)]:
        rows = [[5] * (longest - 1) + [1], [6, 1]]
        inputs_BS = _padded_batch(rows, batch_size=32)
        assert inputs_BS.shape == (2, padded)
        assert inputs_BS[0, :longest].tolist() == rows[0] and not inputs_BS[0, longest:].any()
    assert _padded_batch([[5, 1]] * 3, batch_size=32).shape == (4, 8)
    model = Transformer(CONFIG)
    params = model.init(jax.random.key(4), jnp.ones((1, 4), jnp.int32),
                        jnp.ones((1, 4), jnp.int32))["params"]
    outputs = predict(model, params, [[5] * 7 + [1], [5] * 8 + [1]], beam_size=1, alpha=0.6,
                      max_extra_length=3, batch_size=1)
    assert [output.shape for output in outputs] == [(8 + 3,), (16 + 3,)]


@pytest.mark.usefixtures("on_the_cpu")
def test_steps_per_loop_iteration_give_the_same_search_through_the_cache():
    """Beam 4 through the model's cache with 1, 2 or 3 steps per iteration of the loop: the
    same hypotheses and scores. The learned position table has MAX_LENGTH rows, so at 2 steps
    per iteration the discarded 8th step runs past the table (its logits NaN) and is left out."""
    _, _, _, cache, step = setup(get_model_config(
        "tiny", vocab_size=30, positional_encoding="learned", max_length=MAX_LENGTH), seed=5)
    search = functools.partial(beam_search, step, cache, batch_size=3, beam_size=4,
                               max_length=MAX_LENGTH, alpha=0.6, return_all=True)
    seqs, scores = search(unroll=1)
    assert np.isfinite(np.asarray(scores)).all()
    assert (np.asarray(seqs) != 1).all(axis=-1).any()  # one without EOS: 7 steps were run
    for unroll in (2, 3):
        unrolled_seqs, unrolled_scores = search(unroll=unroll)
        np.testing.assert_array_equal(unrolled_seqs, seqs)
        np.testing.assert_array_equal(unrolled_scores, scores)


def loop_body_copies(hlo_text: str, shape: str) -> int:
    """Copies of arrays of `shape` (e.g. "f32[12,2,7,16]") in the bodies of the compiled
    program's while loops."""
    bodies = set(re.findall(r"body=(%[\w.-]+)", hlo_text))
    count, inside = 0, False
    for line in hlo_text.splitlines():
        if line and not line.startswith(" "):  # a computation's first line, or its end
            inside = line.split()[0] in bodies
        count += inside and re.search(rf"= {re.escape(shape)}\S* copy\(", line) is not None
    return count


@pytest.mark.usefixtures("on_the_cpu")
def test_two_steps_per_loop_iteration_leave_the_caches_uncopied():
    """Why beam search unrolls its loop: with one step per iteration, XLA copies each layer's
    reordered key and value cache back into the loop's buffers every step (float32 on the
    CPU: 2 layers × keys and values); with 2, the copies are gone."""
    _, _, _, cache, step = setup()
    batch, heads, length, head_dim = cache.self_kv[0].key_BNCH.shape
    shape = f"f32[{batch * 4},{heads},{length},{head_dim}]"  # beam 4

    def copies(unroll):
        search = jax.jit(lambda cache: beam_search(step, cache, batch_size=3, beam_size=4,
                                                   max_length=MAX_LENGTH, alpha=0.6,
                                                   unroll=unroll))
        return loop_body_copies(search.lower(cache).compile().as_text(), shape)

    assert (copies(1), copies(2)) == (4, 0)


BFLOAT16 = get_model_config("tiny", vocab_size=30, dtype="bfloat16")


@pytest.mark.usefixtures("on_the_cpu")
def test_matrices_cast_once_leave_a_bfloat16_search_unchanged_bit_for_bit():
    """`cast_matmul_params`: the encoder's output, a cached step's logits and beam 4's
    hypotheses and scores are those of the float32 parameters, bit for bit; casting the
    layer norms' parameters too would change them (they scale in float32)."""
    model, variables, inputs_BS, _, _ = setup(BFLOAT16)
    # Layer norms start at scale 1 and bias 0, which bfloat16 holds exactly: perturbed.
    leaves, tree = jax.tree.flatten(variables["params"])
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(key, x.shape)
                                       for x, key in zip(leaves, keys)])
    cast = cast_matmul_params(params, jnp.bfloat16)
    assert {str(x.dtype) for x in jax.tree.leaves(cast["decoder"]["layer_0"]["ffn_norm"])} == {
        "float32"}
    assert cast["decoder"]["layer_0"]["ffn"]["wi"]["bias"].dtype == jnp.bfloat16
    assert cast["embedder"]["table"]["embedding"].dtype == jnp.bfloat16

    @jax.jit
    def outputs(params):
        model, variables = Transformer(BFLOAT16), {"params": params}
        memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
        cache = model.apply(variables, memory_BSD, inputs_BS, MAX_LENGTH,
                            method=Transformer.init_cache)
        step = functools.partial(model.apply, variables, method=Transformer.decode_step)
        logits, _ = step(jnp.full((3, 1), 2), cache)
        return memory_BSD, logits, *beam_search(step, cache, batch_size=3, beam_size=4,
                                                 max_length=MAX_LENGTH, alpha=0.6,
                                                 return_all=True)

    for kept, changed in zip(outputs(params), outputs(cast)):
        np.testing.assert_array_equal(changed, kept)
    assert all(a is b for a, b in zip(jax.tree.leaves(cast_matmul_params(params, jnp.float32)),
                                      jax.tree.leaves(params)))  # float32: no copy
    all_cast = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    assert not np.array_equal(outputs(all_cast)[1], outputs(params)[1])


def loop_casts(jaxpr) -> int:
    """Casts, in the first while loop's body of `jaxpr`, of the loop's invariant inputs."""
    (loop,) = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "while"][:1]
    body = loop.params["body_jaxpr"].jaxpr
    invariant = set(body.invars[:loop.params["body_nconsts"]])
    return sum(eqn.primitive.name == "convert_element_type" and eqn.invars[0] in invariant
               for eqn in body.eqns)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_bfloat16_search_casts_no_parameter_inside_its_loop(beam_size):
    """XLA does not hoist a cast out of a while loop (an H100 ran 49 casts of the matrices
    every step): `predict_step` casts them before its loop; the model alone casts them in
    it."""
    model = Transformer(BFLOAT16)
    inputs_BS = jnp.array([[5, 6, 7, 8, 0], [9, 3, 0, 0, 0]])
    params = model.init(jax.random.key(0), inputs_BS, inputs_BS)["params"]

    def casts():  # a new function each time: jax keeps the traces of one
        search = functools.partial(predict_step, model=model, beam_size=beam_size,
                                   max_length=MAX_LENGTH, alpha=0.6)
        return loop_casts(jax.make_jaxpr(search)(params, inputs_BS).jaxpr)

    assert casts() == 0
    # Per traced step (beam search traces 2 per iteration), 2 decoder layers × 8 dense layers
    # × (kernel, bias), and the table the logits are projected onto.
    steps = 1 if beam_size == 1 else 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(steps_module, "cast_matmul_params", lambda params, dtype: params)
        assert casts() == steps * (2 * 8 * 2 + 1)


@pytest.mark.usefixtures("on_the_cpu")
def test_predict_casts_the_matrices_once_for_all_its_batches(monkeypatch):
    """`predict` of a bfloat16 model casts its matrices once and hands every batch's search
    the cast ones (the layer norms float32), with the outputs of searches left to cast
    them."""
    from transformer_jax import predict as predict_module

    model = Transformer(BFLOAT16)
    sources = [[5, 6, 7, 8, 1], [9, 3, 1], [4, 4, 4, 4, 4, 4, 4, 4, 4, 1]]
    params = model.init(jax.random.key(2), jnp.ones((1, 4), jnp.int32),
                        jnp.ones((1, 4), jnp.int32))["params"]
    calls, handed = [], []
    cast, search = predict_module.cast_matmul_params, predict_module._predict_step
    monkeypatch.setattr(predict_module, "cast_matmul_params", lambda params, dtype: (
        calls.append(dtype), cast(params, dtype))[1])
    monkeypatch.setattr(predict_module, "_predict_step", lambda params, inputs_BS, **kw: (
        handed.append(params), search(params, inputs_BS, **kw))[1])
    def run():
        return predict_module.predict(model, params, sources, beam_size=1, alpha=0.6,
                                      max_extra_length=3, batch_size=2)

    outputs = run()
    assert calls == [jnp.bfloat16] and len(handed) == 2  # one cast, two batches
    for matrices in handed:
        assert matrices["embedder"]["table"]["embedding"].dtype == jnp.bfloat16
        assert matrices["encoder"]["layer_0"]["ffn"]["wo"]["kernel"].dtype == jnp.bfloat16
        assert matrices["encoder"]["layer_0"]["ffn_norm"]["scale"].dtype == jnp.float32
    monkeypatch.setattr(predict_module, "cast_matmul_params", lambda params, dtype: params)
    for cast_once, uncast in zip(outputs, run(), strict=True):
        np.testing.assert_array_equal(cast_once, uncast)
