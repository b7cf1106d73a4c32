"""The `decode` suite: greedy and beam-4 search, with and without the key/value cache.

Cached: `Transformer.init_cache` + `decode_step`, as `translate.py` decodes.
Uncached: each step runs the whole decoder again over a fixed buffer of the
tokens generated so far (the cost the cache removes: every step recomputes
every earlier position). EOS is never chosen here, so every sentence
generates exactly `max_length` tokens and both variants do the same steps.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import tqdm
from jax import lax

from transformer_jax.benchmark import report
from transformer_jax.benchmark.model import (combinations, jax_options, model_configs,
                                             split_fields, synthetic_batch)
from transformer_jax.benchmark.timing import (SPREAD_NOTE, compile_seconds, timed_seconds,
                                              traced_as)
from transformer_jax.token_ids import EOS_ID, PAD_ID
from transformer_jax.decoding import UNROLL, beam_search, greedy_search
from transformer_jax.model import Transformer, cast_matmul_params
from transformer_jax.model_config import ModelConfig
from transformer_jax.train_state import init_params

_LOWEST = jnp.finfo(jnp.float32).min


def _never_end(logits_RV):
    return logits_RV.at[:, jnp.array([PAD_ID, EOS_ID])].set(_LOWEST)


def _cached_callback(model, variables, memory_BSD, inputs_BS, max_length):
    cache = model.apply(variables, memory_BSD, inputs_BS, max_length,
                        method=Transformer.init_cache)

    def tokens_to_logits(ids_R1, cache):
        logits_RV, cache = model.apply(variables, ids_R1, cache, method=Transformer.decode_step)
        return _never_end(logits_RV), cache

    return tokens_to_logits, cache


def _uncached_callback(model, variables, memory_BSD, inputs_BS, max_length):
    batch = inputs_BS.shape[0]
    state = {"memory": memory_BSD, "inputs": inputs_BS, "index": jnp.zeros((batch,), jnp.int32),
             # Not-yet-generated slots hold a non-padding filler: the full decoder masks keys
             # whose target is padding, and key i (input: token i - 1) must stay visible to
             # query i. Causality hides every later slot.
             "generated": jnp.full((batch, max_length), EOS_ID, jnp.int32)}

    def tokens_to_logits(ids_R1, state):
        i = state["index"][0]
        # ids are the token generated at step i - 1 (the start symbol at step 0).
        written = lax.dynamic_update_slice(state["generated"], ids_R1, (0, jnp.maximum(i - 1, 0)))
        generated = jnp.where(i > 0, written, state["generated"])
        logits_RTV = model.apply(variables, state["memory"], state["inputs"], generated,
                                 method=Transformer.decode)  # shifts right inside
        logits_RV = lax.dynamic_index_in_dim(logits_RTV, i, axis=1, keepdims=False)
        return _never_end(logits_RV), dict(state, generated=generated, index=state["index"] + 1)

    return tokens_to_logits, state


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "max_length", "cached",
                                              "unroll", "cast_once"))
def search(params, inputs_BS, *, model, beam_size: int, max_length: int, cached: bool,
           unroll: int = UNROLL, cast_once: bool = True):
    """Encode once, then greedy (beam_size 1) or beam search for `max_length` tokens; the
    matrices cast to the compute dtype before the loop, as `steps.predict_step` casts them
    (`cast_once`), or by the model at every step."""
    variables = {"params": cast_matmul_params(params, model.config.compute_dtype)
                 if cast_once else params}
    memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    make = _cached_callback if cached else _uncached_callback
    tokens_to_logits, cache = make(model, variables, memory_BSD, inputs_BS, max_length)
    batch = inputs_BS.shape[0]
    if beam_size == 1:
        return greedy_search(tokens_to_logits, cache, batch_size=batch, max_length=max_length)
    return beam_search(tokens_to_logits, cache, batch_size=batch, beam_size=beam_size,
                       max_length=max_length, alpha=0.6, unroll=unroll)[0]


def cases(quick: bool) -> list[tuple[str, int, int, int]]:
    """(model, batch, source length, output length)."""
    if quick:
        return [("tiny", 2, 8, 8)]
    if jax.default_backend() == "cpu":
        return [("small", 8, 32, 64), ("base", 8, 32, 64)]
    # The target's shape: base, batch 64 of ~30-token sources, 32 output tokens each.
    return [("base", 64, 32, 32)]


def default_dtypes(quick: bool) -> tuple[str, ...]:
    """float32, and on accelerators bfloat16 beside it (parameters stay float32; `search`
    casts its matrices)."""
    return ("float32",) if quick or jax.default_backend() == "cpu" else ("float32", "bfloat16")


SEARCHES = ("greedy", "beam4")  # the suite's, by the names of its rows' "search" column


def beam_size(search: str) -> int:
    """1 for "greedy", K for "beamK" (K at least 2): a search by its rows' name; a
    ValueError names the forms it takes."""
    if search == "greedy":
        return 1
    k = search.removeprefix("beam")
    if k == search or not k.isdigit() or int(k) < 2:
        raise ValueError(f"a search is greedy or beamK with a beam size K of 2 or more "
                         f"(beam4), got {search!r}")
    return int(k)


def time_search(name, batch, source_len, max_length, *, beam_size, cached, quick,
                dtype="float32", unroll=UNROLL, cast_once=True,
                fields: dict | None = None) -> dict:
    """One row: the search compiled and timed. `fields` replace the model's `ModelConfig`
    fields, or set XLA's options where named `xla_...`, or JAX's where named `jax_...`; they
    are columns of the row."""
    fields = fields or {}
    model_fields, xla_options, jax_settings = split_fields(fields)
    config = dataclasses.replace(model_configs()[name], dtype=dtype, **model_fields)
    model = Transformer(config)
    inputs_BS = jnp.asarray(synthetic_batch(config, batch, source_len)["inputs"])
    params = _params(dataclasses.replace(config, dtype="float32"))
    kwargs = dict(model=model, beam_size=beam_size, max_length=max_length, cached=cached,
                  unroll=unroll, cast_once=cast_once)
    with jax_options(jax_settings):  # the search traced and compiled with them
        compiled, compile_s = compile_seconds(search, params, inputs_BS,
                                              compiler_options=xla_options, **kwargs)
    kind = "greedy" if beam_size == 1 else f"beam{beam_size}"
    cache = "cached" if cached else "uncached"
    unroll = 1 if beam_size == 1 else unroll  # greedy search: one step per iteration
    options = "".join(f"-{field}={value}" for field, value in fields.items())
    cast = "once" if cast_once else "each step"
    label = f"{name}-{dtype}-{kind}-{cache}-{batch}x{max_length}-unroll{unroll}"
    with traced_as(label + ("" if cast_once else "-cast_each_step") + options, compiled):
        timed = timed_seconds(lambda: compiled(params, inputs_BS).block_until_ready(),
                              warmup=1, iters=3 if quick else 5)
    seconds = timed.median
    return {"model": name, "dtype": dtype, "search": kind, "cache": cache, "batch": batch,
            "source_len": source_len, "output_len": max_length, "ms": seconds * 1e3,
            **timed.columns(),
            "tokens_per_sec": batch * max_length / seconds, "sentences_per_sec": batch / seconds,
            "unroll": unroll, "cast": cast, **fields, "compile_s": compile_s}


@functools.cache
def _params(config: ModelConfig) -> dict:
    """Random float32 parameters of a model of `config`, drawn once per process: the compute
    dtype leaves them as they are, so the suite's searches of one float32 `config` share one
    initialization (compiled once, not once per search)."""
    return jax.jit(functools.partial(init_params, Transformer(config)))(jax.random.key(0))


def run(quick: bool = False, vary: dict | None = None, dtypes=None,
        searches=None) -> tuple[list[dict], list[str]]:
    """The rows of every case, dtype and search (`dtypes` and `searches`, e.g. ("bfloat16",)
    and ("beam4",), default `default_dtypes(quick)` and `SEARCHES`); `vary` maps
    `ModelConfig` fields, or XLA's options, to the values to build or compile the searches
    with, e.g. {"attention_implementation": ("auto", "xla")} or
    {"xla_gpu_enable_command_buffer": ("", "FUSION")}: every combination of a search, one
    after another in this process."""
    rows = []
    grid = [(case, dtype, beam_size(search), options) for case in cases(quick)
            for dtype in dtypes or default_dtypes(quick) for search in searches or SEARCHES
            for options in combinations(vary)]
    for (name, batch, source_len, max_length), dtype, k, options in tqdm.tqdm(
            grid, desc="decode", disable=quick):
        run_search = functools.partial(time_search, name, batch, source_len, max_length,
                                       beam_size=k, quick=quick, dtype=dtype, fields=options)
        pair = [report.measured(run_search(cached=cached)) for cached in (True, False)]
        pair[0]["speedup"] = pair[0]["tokens_per_sec"] / pair[1]["tokens_per_sec"]
        rows += pair
        if k > 1 and UNROLL > 1:  # the loop's unrolling beside one step per iteration
            one = report.measured(run_search(cached=True, unroll=1))
            pair[0]["vs_unroll_1"] = pair[0]["tokens_per_sec"] / one["tokens_per_sec"]
            rows.append(one)
        if dtype != "float32":  # the matrices cast by the model at every step, beside once
            each = report.measured(run_search(cached=True, cast_once=False))
            pair[0]["vs_cast_each_step"] = pair[0]["tokens_per_sec"] / each["tokens_per_sec"]
            rows.append(each)
    return rows, ["tokens_per_sec: output tokens of the best hypothesis per second "
                  "(every sentence generates output_len tokens)",
                  "speedup: cached tokens/s over uncached, same model and search", SPREAD_NOTE,
                  "unroll: search steps per iteration of the loop (beam search's default: "
                  f"{UNROLL})" + ("; vs_unroll_1: tokens/s over the same search at 1"
                                 if any("vs_unroll_1" in row for row in rows) else ""),
                  "cast: the matrices cast to the compute dtype once, before the search's loop "
                  "(as translate.py), or at each step"
                  + ("; vs_cast_each_step: tokens/s over the same search cast at each step"
                     if any("vs_cast_each_step" in row for row in rows) else "")]
