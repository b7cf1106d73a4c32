"""The `attention` suite: every available implementation, timed as compiled kernels.

Grid: sequence length (T = S) × head dim × dtype × causal, forward and
forward+backward, at a fixed number of tokens per call (B·T), so short and long
sequences do comparable work per call. On accelerators: bfloat16 only (float32
has no fused kernel), and each timed run queues 10 calls back to back. The
"auto" rows carry `vs_fastest`: the fastest other implementation's time over
auto's at that shape (where auto runs the fastest, 1.0 but for the timing's noise).

Then the masks of training, at the base and big models' heads on their rows
(`model` names the model): `mask` "none", "packed" (self-attention on packed
rows: each query sees the keys of its own example, as model.py builds the mask
from the segment ids) or "packed cross" (target queries over the source keys of
the same examples), causal or not. Those rows also carry `error`: the relative
error against float32 "reference" attention on the same inputs over the real
queries, of the output (forward rows) or of the largest of dQ, dK and dV (fwd+bwd
rows). Beside our implementations, one peer: Pallas's Triton `mha` with segment
ids (NVIDIA GPUs, self-attention), the fastest forward on packed rows on an H100.
cuDNN's packed layout (segment offsets through JAX's private
`fused_attention_stablehlo`) is no peer: there it was 3.6x slower than the bias
that "cudnn" uses and gave NaN gradients (BENCHMARKS.md).
"""

import functools

import jax
import numpy as np
import tqdm
import jax.numpy as jnp

from transformer_jax.argument_checks import positive_int
from transformer_jax.attention import (attention_implementations, available_implementations,
                                      cudnn_unsupported, dot_product_attention,
                                      resolve_implementation)
from transformer_jax.benchmark import report
from transformer_jax.benchmark.flops import attention_flops
from transformer_jax.benchmark.machine import peak_note, peak_tflops
from transformer_jax.benchmark.model import model_configs, packed_segments_BT
from transformer_jax.benchmark.timing import (MEMORY_NOTE, SPREAD_NOTE, back_to_back,
                                              compile_seconds, memory_bytes, timed_seconds)
from transformer_jax.masks import combine_masks, padding_mask, segment_mask
from transformer_jax.model_config import DTYPES as MODEL_DTYPES

DTYPES = ("float32", "bfloat16")


# The kinds of mask timed at the models' shapes, as (mask, causal): the encoder's self-attention,
# the decoder's (causal) and encoder-decoder attention, each beside the unmasked kernel.
MASKS = (("none", False), ("none", True), ("packed", False), ("packed", True),
         ("packed cross", False))


def grid(quick: bool) -> dict:
    """The shapes for this backend: 128..4096 on accelerators, shorter on CPUs; then the
    masks at `models` (name -> rows B, tokens T; heads and head dim the model's), on rows
    packed with examples of example_sizes[0]..example_sizes[1]-1 tokens."""
    if quick:
        return dict(seq_lens=(16, 32), head_dims=(64,), dtypes=("float32",), causal=(False,),
                    num_heads=2, tokens=64, models={"tiny": (2, 32)},
                    masks=(("packed", True),), example_sizes=(3, 12))
    if jax.default_backend() == "cpu":
        return dict(seq_lens=(128, 256, 512, 1024), head_dims=(64, 128), dtypes=DTYPES,
                    causal=(False, True), num_heads=8, tokens=2048,
                    models={"base": (8, 256), "big": (4, 512)}, masks=MASKS,
                    example_sizes=(5, 60))
    return dict(seq_lens=(128, 512, 2048, 4096), head_dims=(64, 128),
                dtypes=("bfloat16",), causal=(False, True), num_heads=16, tokens=32768,
                models={"base": (96, 256), "big": (48, 512)}, masks=MASKS,
                example_sizes=(5, 60))


def attention_call(attend, *, causal: bool, backward: bool):
    """A jitted function of (q, k, v, *segments): `attend(q, k, v, *segments,
    is_causal=causal)`, or the gradients of its sum with respect to q, k and v."""

    def forward(q_BTNH, k_BSNH, v_BSNH, *segments):
        return attend(q_BTNH, k_BSNH, v_BSNH, *segments, is_causal=causal)

    if not backward:
        return jax.jit(forward)
    loss = lambda *args: forward(*args).astype(jnp.float32).sum()  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def random_qkv(batch, seq_len, num_heads, head_dim, dtype) -> tuple[jax.Array, ...]:
    """Queries, keys and values `(B, T, N, H)` of standard normal values in `dtype`."""
    keys = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.random.normal(key, (batch, seq_len, num_heads, head_dim), dtype)
                 for key in keys)


def time_case(implementation: str, *, batch, seq_len, num_heads, head_dim, dtype, causal,
              backward, quick, attend=None, mask="none", segments=()) -> dict:
    """One row: `implementation` of `dot_product_attention`, or a peer's `attend(q, k, v,
    *segments, is_causal)` reported under that name; `segments` are the arrays a `mask`
    other than "none" is built from, inside the timed call (as the model builds it)."""
    if attend is None:
        attend = functools.partial(dot_product_attention, implementation=implementation)
    q, k, v = random_qkv(batch, seq_len, num_heads, head_dim, dtype)
    compiled, _ = compile_seconds(attention_call(attend, causal=causal, backward=backward),
                                  q, k, v, *segments)
    calls = 1 if jax.default_backend() == "cpu" else 10
    timed = timed_seconds(back_to_back(lambda: compiled(q, k, v, *segments), calls),
                          warmup=1 if quick else 2, iters=3 if quick else (10 if calls == 1 else 5))
    seconds = timed.median / calls
    flops = attention_flops(batch, seq_len, seq_len, num_heads, head_dim, causal=causal,
                            backward=backward)
    peak, _ = peak_tflops(dtype, quick=quick)
    tflops = flops / seconds / 1e12
    runs = (implementation if implementation not in attention_implementations() else
            resolve_implementation(implementation, jnp.dtype(dtype), head_dim=head_dim,
                                   query_len=seq_len, key_len=seq_len,
                                   masked=causal or mask != "none"))
    return {"implementation": implementation, "runs": runs,
            "pass": "fwd+bwd" if backward else "forward", "dtype": dtype, "mask": mask,
            "causal": causal, "batch": batch, "seq_len": seq_len,
            "num_heads": num_heads, "head_dim": head_dim, "ms": seconds * 1e3,
            **timed.columns(), "tflops": tflops,
            "peak_tflops": peak, "peak_fraction": tflops / peak if peak else None,
            "memory_bytes": memory_bytes(compiled)}


SHAPE_KEYS = ("model", "mask", "pass", "dtype", "causal", "batch", "seq_len", "num_heads",
              "head_dim")


def compare_auto(rows: list[dict]) -> float | None:
    """Adds to each "auto" row `vs_fastest` (the fastest other row of its shape: its ms over
    auto's) and `fastest` (that row's implementation); returns the lowest ratio, or None
    when no shape has another implementation. Where auto runs the fastest one, the ratio
    is one program timed twice: its spread is the timing's noise."""
    fastest = {}
    for row in rows:
        if row["implementation"] != "auto":
            shape = tuple(row.get(key) for key in SHAPE_KEYS)
            if row["ms"] < fastest.get(shape, (float("inf"),))[0]:
                fastest[shape] = (row["ms"], row["implementation"])
    ratios = []
    for row in rows:
        shape = tuple(row.get(key) for key in SHAPE_KEYS)
        if row["implementation"] == "auto" and shape in fastest:
            row["vs_fastest"] = fastest[shape][0] / row["ms"]
            row["fastest"] = fastest[shape][1]
            ratios.append(row["vs_fastest"])
    return min(ratios, default=None)


# --- the masks of training -----------------------------------------------------------------


def source_segments_BS(rng, target_segments_BT) -> np.ndarray:
    """Source segment ids for packed target rows: the same examples in the same order, each
    with half to all as many source tokens as target tokens, then padding (0)."""
    segments_BS = np.zeros_like(target_segments_BT)
    for row, targets_T in enumerate(target_segments_BT):
        examples, sizes = np.unique(targets_T[targets_T > 0], return_counts=True)
        used = 0
        for example, size in zip(examples, sizes):
            length = int(rng.integers((size + 1) // 2, size + 1))
            segments_BS[row, used:used + length] = example
            used += length
    return segments_BS


def mask_segments(mask: str, batch: int, seq_len: int, example_sizes, seed: int = 0) -> tuple:
    """The arrays `mask` is built from: none for "none", else the segment ids of the queries
    `(B, T)` and of the keys `(B, S)`, rows packed as `model.packed_segments_BT` packs them."""
    if mask == "none":
        return ()
    rng = np.random.default_rng(seed)
    queries_BT = packed_segments_BT(rng, batch, seq_len, sizes=example_sizes)
    keys_BS = source_segments_BS(rng, queries_BT) if mask == "packed cross" else queries_BT
    return jnp.asarray(queries_BT), jnp.asarray(keys_BS)


def packed_mask_B1TS(query_segments_BT, key_segments_BS):
    """The model's mask for packed rows (model.py): the keys of the query's own example,
    none of them padding. Padding queries see no key."""
    return combine_masks(padding_mask(key_segments_BS),
                         segment_mask(query_segments_BT, key_segments_BS))


def ours(implementation: str):
    """`attend(q, k, v, *segments, is_causal)`: our `implementation`, with the packed mask
    when segment ids are given."""

    def attend(q_BTNH, k_BSNH, v_BSNH, *segments, is_causal):
        mask_B1TS = packed_mask_B1TS(*segments) if segments else None
        return dot_product_attention(q_BTNH, k_BSNH, v_BSNH, mask=mask_B1TS, is_causal=is_causal,
                                     implementation=implementation)

    return attend


def pallas_mha(q_BTNH, k_BSNH, v_BSNH, *segments, is_causal, interpret=False):
    """Pallas's Triton flash attention (jax.experimental.pallas.ops.gpu, deprecated from
    jax 0.11 for tokamax). It takes one set of segment ids for queries and keys, and lets
    padding queries see the padding keys (segment 0), whose outputs nothing uses."""
    from jax.experimental.pallas.ops.gpu import attention as pallas

    return pallas.mha(q_BTNH, k_BSNH, v_BSNH, segment_ids=segments[0] if segments else None,
                      sm_scale=q_BTNH.shape[-1] ** -0.5, causal=is_causal, interpret=interpret)


def pallas_unsupported(mask: str) -> str:
    """Why the Pallas peer cannot run `mask` here, or "" when it can."""
    if jax.default_backend() != "gpu":
        return f"needs an NVIDIA GPU (Triton), but the JAX backend is {jax.default_backend()!r}"
    if mask == "packed cross":
        return "takes one set of segment ids: self-attention only"
    try:
        from jax.experimental.pallas.ops.gpu import attention  # noqa: F401
    except ImportError as error:
        return f"not in jax {jax.__version__} ({error})"
    return ""


PEERS = {"pallas_mha": (pallas_mha, pallas_unsupported)}


def unavailable(dtype: str) -> list[str]:
    """"name at dtype: why not" for our implementations that cannot run `dtype` here (as
    `available_implementations` leaves them out)."""
    reason = cudnn_unsupported(dtype)
    return [f"cudnn at {dtype}: {reason}"] if reason else []


def mask_implementations(dtype: str, mask: str) -> tuple[dict, list[str]]:
    """(name -> attend for "auto", our implementations and the peers that can run `mask`
    with `dtype` here; "name at dtype: why not" for the others)."""
    attends = {name: ours(name) for name in ("auto", *available_implementations(
        jnp.dtype(dtype)))}
    skipped = unavailable(dtype)
    for name, (attend, unsupported) in PEERS.items():
        reason = unsupported(mask)
        if reason:
            skipped.append(f"{name} at {dtype}: {reason}")
        else:
            attends[name] = attend
    return attends, skipped


def outputs(attend, qkv, segments, *, causal: bool, dtype) -> list[np.ndarray]:
    """float32: `attend`'s output on the real queries (0 on padding), then dQ, dK and dV of
    its sum weighted by normal noise on the real queries; the inputs cast to `dtype`."""
    q_BTNH = qkv[0]
    real_BT = segments[0] != 0 if segments else jnp.ones(q_BTNH.shape[:2], bool)
    real_BT11 = real_BT[:, :, None, None].astype(jnp.float32)
    weights_BTNH = jax.random.normal(jax.random.key(1), q_BTNH.shape) * real_BT11

    @jax.jit
    def output_and_grads(q_BTNH, k_BSNH, v_BSNH, real_BT11, weights_BTNH, *segments):
        out_BTNH, vjp = jax.vjp(lambda *qkv: attend(*qkv, *segments, is_causal=causal).astype(
            jnp.float32), *(x.astype(dtype) for x in (q_BTNH, k_BSNH, v_BSNH)))
        return [out_BTNH * real_BT11, *vjp(weights_BTNH)]

    got = output_and_grads(*qkv, real_BT11, weights_BTNH, *segments)
    return [np.asarray(x, np.float32) for x in got]


def relative_errors(got: list, reference: list) -> tuple[float, float]:
    """(‖out − ref‖ / ‖ref‖ of the output, the largest of those of dQ, dK and dV); NaN
    where any is NaN."""
    errors = [np.linalg.norm(g - r) / np.linalg.norm(r) for g, r in zip(got, reference)]
    return float(errors[0]), float(np.max(errors[1:]))


def mask_case_rows(model: str, mask: str, causal: bool, dtype: str, g: dict,
                   quick: bool) -> tuple[list[dict], list[str]]:
    """The rows of one mask at one model's shape: each implementation's error against
    float32 "reference", then its time, forward and fwd+bwd; and what was skipped."""
    config = model_configs()[model]
    batch, seq_len = g["models"][model]
    shape = dict(batch=batch, seq_len=seq_len, num_heads=config.num_heads,
                 head_dim=config.d_model // config.num_heads)
    segments = mask_segments(mask, batch, seq_len, g["example_sizes"])
    qkv = random_qkv(**shape, dtype=dtype)
    reference = outputs(ours("reference"), qkv, segments, causal=causal, dtype=jnp.float32)
    attends, skipped = mask_implementations(dtype, mask)
    rows = []
    for name, attend in attends.items():
        try:
            errors = relative_errors(outputs(attend, qkv, segments, causal=causal, dtype=dtype),
                                     reference)
            timed = [{"model": model, **time_case(
                name, attend=attend, mask=mask, segments=segments, dtype=dtype, causal=causal,
                backward=backward, quick=quick, **shape), "error": error}
                for backward, error in zip((False, True), errors)]
            rows += map(report.measured, timed)  # both or neither: a peer may fail on one
        except Exception as error:  # noqa: BLE001 (a peer's failure is reported; ours raise)
            if name not in PEERS:
                raise
            skipped.append(f"{name} at {dtype}, {model}, {mask}: failed, "
                           f"{type(error).__name__}: {str(error)[:160]}")
    return rows, skipped


def mask_rows(g: dict, quick: bool) -> tuple[list[dict], list[str]]:
    """(the rows of every mask at every model's shape, what was skipped, once each)."""
    cases = [(model, mask, causal, dtype) for dtype in g["dtypes"] for model in g["models"]
             for mask, causal in g["masks"]]
    rows, skipped = [], []
    for case in tqdm.tqdm(cases, desc="attention masks", disable=quick):
        case_rows, case_skipped = mask_case_rows(*case, g, quick)
        rows += case_rows
        skipped += case_skipped
    return rows, list(dict.fromkeys(skipped))


def _check_grid(g: dict) -> None:
    """`g`'s sizes as Python ints (the rows go to JSON), or a ValueError naming the grid key
    whose value cannot be timed: a float64 row would be float32 under JAX's default (x64
    off) with float64's name, and sizes of 0 divide by 0."""
    for key in ("seq_lens", "head_dims"):
        try:
            g[key] = tuple(positive_int(key, n) for n in g[key])
        except ValueError:
            raise ValueError(f"{key} must be positive integers, got {g[key]!r}") from None
    for key in ("num_heads", "tokens"):
        g[key] = positive_int(key, g[key])
    if bad := [d for d in g["dtypes"] if d not in MODEL_DTYPES]:
        raise ValueError(f"dtypes must be among {MODEL_DTYPES}, got {bad!r}")


def run(quick: bool = False, **overrides) -> tuple[list[dict], list[str]]:
    """(one row per case, notes on how to read them).

    `overrides` replace parts of `grid(quick)`, e.g. `seq_lens=(128, 256)`,
    `dtypes=("float32",)`, `causal=(False,)` (from a notebook), `models={}` (no mask rows).
    """
    g = grid(quick)
    unknown = set(overrides) - set(g)
    if unknown:
        raise ValueError(f"unknown attention grid keys {sorted(unknown)}; use {sorted(g)}")
    g.update(overrides)
    _check_grid(g)
    grid_cases = [dict(implementation=name, dtype=dtype, head_dim=head_dim, causal=causal,
                       backward=backward, seq_len=seq_len)
                  for dtype in g["dtypes"]
                  for name in ("auto", *available_implementations(jnp.dtype(dtype)))
                  for head_dim in g["head_dims"] for causal in g["causal"]
                  for backward in (False, True) for seq_len in g["seq_lens"]]
    rows = [report.measured(time_case(**case, batch=max(1, g["tokens"] // case["seq_len"]),
                                      num_heads=g["num_heads"], quick=quick))
            for case in tqdm.tqdm(grid_cases, desc="attention", disable=quick)]
    masked, skipped = mask_rows(g, quick)
    rows += masked
    skipped = list(dict.fromkeys([reason for d in g["dtypes"] for reason in unavailable(d)]
                                 + skipped))
    slowest = compare_auto(rows)
    autos = [row for row in rows if "fastest" in row]
    picked = sum(row["runs"] == row["fastest"] for row in autos)
    peaks = [peak_note(dtype, quick=quick) for dtype in dict.fromkeys(r["dtype"] for r in rows)]
    auto = ", ".join(f"{d} -> {resolve_implementation('auto', jnp.dtype(d))}" for d in DTYPES)
    return rows, [*peaks, f"auto: {auto} (where valid at the shape)",
                  f"vs_fastest: the fastest other implementation's ms over auto's; lowest "
                  f"{slowest:.3f}; auto runs the fastest at {picked} of {len(autos)} shapes"
                  if slowest else "vs_fastest: no other implementation",
                  "tflops: attention_flops() in transformer_jax/benchmark/flops.py "
                  "(causal counts half the square)",
                  MEMORY_NOTE, SPREAD_NOTE,
                  *mask_notes(g), "skipped: " + ("; ".join(skipped) or "none")]


def mask_notes(g: dict) -> list[str]:
    sizes = g["example_sizes"]
    models = ", ".join(f"{name} {b} x {t}" for name, (b, t) in g["models"].items())
    return [f"model: the masks at that model's heads and head dim, on B x T = {models}; "
            f"packed rows hold examples of {sizes[0]}-{sizes[1] - 1} tokens",
            "error: relative to float32 'reference' on the same inputs, over the real "
            "queries: the output (forward), the largest of dQ, dK, dV (fwd+bwd)"]
