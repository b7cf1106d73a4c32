"""The `attention` suite: every available implementation, timed as compiled kernels.

Grid: sequence length (T = S) × head dim × dtype × causal, forward and
forward+backward, at a fixed number of tokens per call (B·T), so short and long
sequences do comparable work per call. On accelerators: bfloat16 only (float32
has no fused kernel), and each timed run queues 10 calls back to back. The
"auto" rows carry `vs_fastest`: the fastest other implementation's time over
auto's at that shape (1.0 when auto picked it).
"""

import functools

import jax
import tqdm
import jax.numpy as jnp

from transformer_jax.attention import (attention_implementations, available_implementations,
                                      dot_product_attention, resolve_implementation)
from transformer_jax.benchmark.flops import attention_flops
from transformer_jax.benchmark.machine import peak_tflops
from transformer_jax.benchmark.timing import (back_to_back, compile_seconds, median_seconds,
                                              memory_bytes)

DTYPES = ("float32", "bfloat16")


def grid(quick: bool) -> dict:
    """The shapes for this backend: 128..4096 on accelerators, shorter on CPUs."""
    if quick:
        return dict(seq_lens=(16, 32), head_dims=(64,), dtypes=("float32",), causal=(False,),
                    num_heads=2, tokens=64)
    if jax.default_backend() == "cpu":
        return dict(seq_lens=(128, 256, 512, 1024), head_dims=(64, 128), dtypes=DTYPES,
                    causal=(False, True), num_heads=8, tokens=2048)
    return dict(seq_lens=(128, 512, 2048, 4096), head_dims=(64, 128),
                dtypes=("bfloat16",), causal=(False, True), num_heads=16, tokens=32768)


def attention_call(attend, *, causal: bool, backward: bool):
    """A jitted function of (q, k, v): `attend(q, k, v, is_causal=causal)`, or the gradients
    of its sum."""

    def forward(q_BTNH, k_BSNH, v_BSNH):
        return attend(q_BTNH, k_BSNH, v_BSNH, is_causal=causal)

    if not backward:
        return jax.jit(forward)
    loss = lambda *qkv: forward(*qkv).astype(jnp.float32).sum()  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def time_case(implementation: str, *, batch, seq_len, num_heads, head_dim, dtype, causal,
              backward, quick, attend=None) -> dict:
    """One row: `implementation` of `dot_product_attention`, or a peer's `attend(q, k, v, *,
    is_causal)` reported under that name."""
    if attend is None:
        attend = functools.partial(dot_product_attention, implementation=implementation)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (batch, seq_len, num_heads, head_dim), dtype)
               for key in keys)
    compiled, _ = compile_seconds(attention_call(attend, causal=causal, backward=backward),
                                  q, k, v)
    calls = 1 if jax.default_backend() == "cpu" else 10
    seconds = median_seconds(back_to_back(lambda: compiled(q, k, v), calls),
                             warmup=1 if quick else 2,
                             iters=3 if quick else (10 if calls == 1 else 5)) / calls
    flops = attention_flops(batch, seq_len, seq_len, num_heads, head_dim, causal=causal,
                            backward=backward)
    peak, _ = peak_tflops(dtype, quick=quick)
    tflops = flops / seconds / 1e12
    runs = (implementation if implementation not in attention_implementations() else
            resolve_implementation(implementation, jnp.dtype(dtype), head_dim=head_dim,
                                   query_len=seq_len, key_len=seq_len, masked=causal))
    return {"implementation": implementation, "runs": runs,
            "pass": "fwd+bwd" if backward else "forward",
            "dtype": dtype, "causal": causal, "batch": batch, "seq_len": seq_len,
            "num_heads": num_heads, "head_dim": head_dim, "ms": seconds * 1e3, "tflops": tflops,
            "peak_tflops": peak, "peak_fraction": tflops / peak if peak else None,
            "memory_bytes": memory_bytes(compiled)}


SHAPE_KEYS = ("pass", "dtype", "causal", "seq_len", "num_heads", "head_dim")


def compare_auto(rows: list[dict]) -> float | None:
    """Adds to each "auto" row `vs_fastest` (the fastest other row of its shape: its ms over
    auto's) and `fastest` (that row's implementation); returns the lowest ratio, or None
    when no shape has another implementation. Where auto runs the fastest one, the ratio
    is one program timed twice: its spread is the timing's noise."""
    fastest = {}
    for row in rows:
        if row["implementation"] != "auto":
            shape = tuple(row[key] for key in SHAPE_KEYS)
            if row["ms"] < fastest.get(shape, (float("inf"),))[0]:
                fastest[shape] = (row["ms"], row["implementation"])
    ratios = []
    for row in rows:
        shape = tuple(row[key] for key in SHAPE_KEYS)
        if row["implementation"] == "auto" and shape in fastest:
            row["vs_fastest"] = fastest[shape][0] / row["ms"]
            row["fastest"] = fastest[shape][1]
            ratios.append(row["vs_fastest"])
    return min(ratios, default=None)


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
    slowest = compare_auto(rows)
    autos = [row for row in rows if "fastest" in row]
    picked = sum(row["runs"] == row["fastest"] for row in autos)
    _, source = peak_tflops("float32", quick=quick)
    auto = ", ".join(f"{d} -> {resolve_implementation('auto', jnp.dtype(d))}" for d in DTYPES)
    return rows, [f"peak: {source}", f"auto: {auto} (where valid at the shape)",
                  f"vs_fastest: the fastest other implementation's ms over auto's; lowest "
                  f"{slowest:.3f}; auto runs the fastest at {picked} of {len(autos)} shapes"
                  if slowest else "vs_fastest: no other implementation",
                  "tflops: attention_flops() in transformer_jax/benchmark/flops.py "
                  "(causal counts half the square)",
                  "memory_bytes: arguments + outputs + temporaries in XLA's buffer plan"]
