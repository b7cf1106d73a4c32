"""The `attention` suite: every available implementation, timed as compiled kernels.

Grid: sequence length (T = S) × head dim × dtype × causal, forward and
forward+backward, at a fixed number of tokens per call (B·T), so short and long
sequences do comparable work per call.
"""

import functools

import jax
import tqdm
import jax.numpy as jnp

from transformer_jax.attention import (available_implementations, dot_product_attention,
                                      resolve_implementation)
from transformer_jax.benchmark.flops import attention_flops
from transformer_jax.benchmark.machine import peak_tflops
from transformer_jax.benchmark.timing import compile_seconds, median_seconds, memory_bytes
from transformer_jax.masks import causal_mask

DTYPES = ("float32", "bfloat16")


def grid(quick: bool) -> dict:
    """The shapes for this backend: 128..4096 on accelerators, shorter on CPUs."""
    if quick:
        return dict(seq_lens=(16, 32), head_dims=(64,), dtypes=("float32",), causal=(False,),
                    num_heads=2, tokens=64)
    if jax.default_backend() == "cpu":
        return dict(seq_lens=(128, 256, 512, 1024), head_dims=(64, 128), dtypes=DTYPES,
                    causal=(False, True), num_heads=8, tokens=2048)
    return dict(seq_lens=(128, 256, 512, 1024, 2048, 4096), head_dims=(64, 128), dtypes=DTYPES,
                causal=(False, True), num_heads=16, tokens=32768)


def attention_call(attend, *, causal: bool, backward: bool):
    """A jitted function of (q, k, v): `attend(q, k, v, mask)`, or the gradients of its sum."""

    def forward(q_BTNH, k_BSNH, v_BSNH):
        mask = causal_mask(q_BTNH.shape[1]) if causal else None
        return attend(q_BTNH, k_BSNH, v_BSNH, mask)

    if not backward:
        return jax.jit(forward)
    loss = lambda *qkv: forward(*qkv).astype(jnp.float32).sum()  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def time_case(implementation: str, *, batch, seq_len, num_heads, head_dim, dtype, causal,
              backward, quick, attend=None) -> dict:
    """One row: `implementation` of `dot_product_attention`, or a peer's `attend(q, k, v,
    mask)` reported under that name."""
    if attend is None:
        attend = functools.partial(dot_product_attention, implementation=implementation)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (batch, seq_len, num_heads, head_dim), dtype)
               for key in keys)
    compiled, _ = compile_seconds(attention_call(attend, causal=causal, backward=backward),
                                  q, k, v)
    seconds = median_seconds(lambda: jax.block_until_ready(compiled(q, k, v)),
                             warmup=1 if quick else 3, iters=3 if quick else 10)
    flops = attention_flops(batch, seq_len, seq_len, num_heads, head_dim, causal=causal,
                            backward=backward)
    peak, _ = peak_tflops(dtype, quick=quick)
    tflops = flops / seconds / 1e12
    return {"implementation": implementation, "pass": "fwd+bwd" if backward else "forward",
            "dtype": dtype, "causal": causal, "batch": batch, "seq_len": seq_len,
            "num_heads": num_heads, "head_dim": head_dim, "ms": seconds * 1e3, "tflops": tflops,
            "peak_tflops": peak, "peak_fraction": tflops / peak if peak else None,
            "memory_bytes": memory_bytes(compiled)}


def run(quick: bool = False, **overrides) -> tuple[list[dict], list[str]]:
    """(one row per case, notes on how to read them).

    `overrides` replace parts of `grid(quick)`, e.g. `seq_lens=(128, 256)`,
    `dtypes=("float32",)`, `causal=(False,)` (from a notebook).
    """
    g = grid(quick)
    unknown = set(overrides) - set(g)
    if unknown:
        raise ValueError(f"unknown attention grid keys {sorted(unknown)}; use {sorted(g)}")
    g.update(overrides)
    grid_cases = [dict(implementation=name, dtype=dtype, head_dim=head_dim, causal=causal,
                       backward=backward, seq_len=seq_len)
                  for dtype in g["dtypes"]
                  for name in ("auto", *available_implementations(jnp.dtype(dtype)))
                  for head_dim in g["head_dims"] for causal in g["causal"]
                  for backward in (False, True) for seq_len in g["seq_lens"]]
    rows = [time_case(**case, batch=max(1, g["tokens"] // case["seq_len"]),
                      num_heads=g["num_heads"], quick=quick)
            for case in tqdm.tqdm(grid_cases, desc="attention", disable=quick)]
    _, source = peak_tflops("float32", quick=quick)
    auto = ", ".join(f"{d} -> {resolve_implementation('auto', jnp.dtype(d))}" for d in DTYPES)
    return rows, [f"peak: {source}", f"auto: {auto}",
                  "tflops: attention_flops() in transformer_jax/benchmark/flops.py "
                  "(causal counts half the square)",
                  "memory_bytes: arguments + outputs + temporaries in XLA's buffer plan"]
