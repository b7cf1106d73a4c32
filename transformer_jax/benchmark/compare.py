"""The `compare` suite: side by side in one run, against what a user would use instead.

1. Our train step against torch.nn.Transformer's (torch_peer.py) with the same
   sizes and batch of full rows; `ratio` = our tokens/s over torch's. On CPUs:
   float32, torch with as many threads as the machine has cores (as XLA). On a
   GPU: bfloat16 (torch under autocast), and torch.compile as a second peer
   (`ratio_compiled`).
2. Our attention ("auto") against the kernel a user would call: Flax's
   `nn.dot_product_attention` on CPUs (forward, float32); on a GPU, torch's
   `scaled_dot_product_attention` with the flash backend (bfloat16, forward and
   forward+backward, causal or not, T 256-4096, head dims 64 and 128), each
   timed as 10 calls back to back. `ratio`: our TFLOP/s over the peer's.
"""

import itertools
import os
import traceback

import flax.linen as nn
import jax
import tqdm

from transformer_jax.benchmark import attention, model, report, torch_peer
from transformer_jax.benchmark.flops import attention_flops, train_step_flops
from transformer_jax.benchmark.machine import peak_note, peak_tflops
from transformer_jax.benchmark.timing import median_seconds
from transformer_jax.masks import causal_mask


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def train_cases(quick: bool) -> list[model.Case]:
    """CPUs: base at 8 × 32 and small at 16 × 32 tokens; a GPU: base at the paper's batch."""
    configs = model.model_configs()
    if quick:
        return [model.Case("tiny", configs["tiny"], 8, 16)]
    if on_gpu():
        return [model.Case("base", configs["base"], 96, 256)]
    return [model.Case("base", configs["base"], 8, 32),
            model.Case("small", configs["small"], 16, 32)]


def torch_row(case: model.Case, *, quick: bool, compile: bool = False) -> dict:
    """The train step of `torch.nn.Transformer` (`torch_peer`) on the case's rows, eager or
    under `torch.compile`; bfloat16 autocast on a GPU, as our step's compute dtype."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if on_gpu() and torch.cuda.is_available() else "cpu"
    half = device == "cuda"
    step = torch_peer.train_step_fn(case.config, model.synthetic_batch(
        case.config, case.batch, case.length), device, autocast=half, compile=compile)
    seconds = median_seconds(step, warmup=1 if quick else 3, iters=2 if quick else 10)
    flops = train_step_flops(case.config, case.batch, case.length, case.length)
    peak, _ = peak_tflops("bfloat16" if half else "float32", quick=quick)
    how = ", bf16 autocast" if half else ""
    return {"framework": f"torch {torch.__version__} nn.Transformer ({device}{how}"
                         f"{', torch.compile' if compile else ''})",
            "model": case.name,
            "batch": case.batch, "length": case.length, "step_ms": seconds * 1e3,
            "tokens_per_sec": case.batch * case.length / seconds,
            "tflops": flops / seconds / 1e12,
            "mfu": flops / seconds / 1e12 / peak if peak else None}


def jax_row(case: model.Case, *, quick: bool) -> dict:
    """Our train step on the same rows, unpacked as the peer's, on one device as the peer
    runs: `sharded`, the faster on one device (on a 2-core CPU the base step 1.14-1.16 x
    pmap's, small 0.99-1.04 x), in bfloat16 on a GPU and float32 on a CPU."""
    dtype, strategy = ("bfloat16" if on_gpu() else "float32"), "sharded"
    row = model.time_train_step(case, dtype, strategy, quick=quick, packed=False,
                                devices=jax.devices()[:1])
    return {"framework": f"transformer_jax ({strategy}{', bf16' if on_gpu() else ''})",
            "model": case.name, "batch": case.batch,
            "length": case.length, "step_ms": row["step_ms"],
            "tokens_per_sec": row["tokens_per_sec"], "tflops": row["tflops"], "mfu": row["mfu"]}


def flax_attention_rows(quick: bool) -> list[dict]:
    """Our attention ("auto") and Flax's `nn.dot_product_attention`, float32 forward, at a
    few lengths; a CPU's peer where PyTorch's flash kernel does not run."""
    rows = []
    num_heads, head_dim = (2, 64) if quick else (8, 64)

    def flax_attend(q, k, v, is_causal):
        return nn.dot_product_attention(q, k, v, mask=causal_mask(q.shape[1]) if is_causal
                                        else None)

    for seq_len in (16, 32) if quick else (128, 256, 512):
        shape = dict(batch=max(1, (64 if quick else 2048) // seq_len), seq_len=seq_len,
                     num_heads=num_heads, head_dim=head_dim, dtype="float32", causal=False,
                     backward=False, quick=quick)
        ours, peer = (attention.time_case("auto", **shape),
                      attention.time_case("flax", attend=flax_attend, **shape))
        rows += [report.measured({"framework": framework, "batch": row["batch"],
                                  "length": seq_len, "heads": num_heads, "head_dim": head_dim,
                                  "causal": False, "pass": row["pass"], "step_ms": row["ms"],
                                  "tflops": row["tflops"]})
                 for framework, row in (("transformer_jax attention (auto)", ours),
                                        ("flax nn.dot_product_attention", peer))]
        rows[-2]["ratio"] = ours["tflops"] / peer["tflops"]
    return rows


def sdpa_rows(num_heads: int = 16, tokens: int = 32768, calls: int = 10) -> list[dict]:
    """Ours ("auto", bfloat16) and torch's flash SDPA at each shape, one after the other."""
    import torch

    rows = []
    for backward, causal, head_dim, seq_len in itertools.product(
            (False, True), (False, True), (64, 128), (256, 512, 1024, 2048, 4096)):
        batch = tokens // seq_len
        shape = dict(batch=batch, seq_len=seq_len, num_heads=num_heads, head_dim=head_dim,
                     causal=causal, backward=backward)
        ours = attention.time_case("auto", dtype="bfloat16", quick=False, **shape)
        seconds = median_seconds(torch_peer.sdpa_fn(**shape, calls=calls), warmup=3,
                                 iters=10) / calls
        peer_tflops = attention_flops(batch, seq_len, seq_len, num_heads, head_dim,
                                      causal=causal, backward=backward) / seconds / 1e12
        common = {"batch": batch, "length": seq_len, "heads": num_heads, "head_dim": head_dim,
                  "causal": causal, "pass": ours["pass"]}
        rows += [report.measured({"framework": "transformer_jax attention (auto)", **common,
                                  "step_ms": ours["ms"], "tflops": ours["tflops"],
                                  "ratio": ours["tflops"] / peer_tflops}),
                 report.measured({"framework": f"torch {torch.__version__} SDPA (flash)",
                                  **common, "step_ms": seconds * 1e3,
                                  "tflops": peer_tflops})]
    return rows


def run(quick: bool = False) -> tuple[list[dict], list[str]]:
    """(rows, notes): each train case with ours beside PyTorch's steps, then attention
    beside torch's flash SDPA on a GPU, or Flax's attention on a CPU."""
    rows, notes = [], ["ratio: ours over the row below it (tokens/s, or TFLOP/s for attention)"]
    missing = torch_peer.torch_available()
    for case in tqdm.tqdm(train_cases(quick), desc="compare", disable=quick):
        ours = report.measured(jax_row(case, quick=quick))
        rows.append(ours)
        if missing:
            continue
        peer = report.measured(torch_row(case, quick=quick))
        ours["ratio"] = ours["tokens_per_sec"] / peer["tokens_per_sec"]
        rows.append(peer)
        if on_gpu():
            rows += sdpa_rows()  # before torch.compile, whose compile takes longest
            try:
                compiled = torch_row(case, quick=quick, compile=True)
            except Exception:  # noqa: BLE001 (torch.compile's failures are many; say which)
                notes.append("torch.compile failed: "
                             + traceback.format_exc(limit=2).strip().splitlines()[-1])
            else:
                ours["ratio_compiled"] = ours["tokens_per_sec"] / compiled["tokens_per_sec"]
                rows.append(report.measured(compiled))
                notes.append("ratio_compiled: ours over the torch.compile row")
    if missing:
        notes.append(f"no PyTorch rows: {missing}")
    for dtype in ("bfloat16",) if on_gpu() else ("float32",):
        notes.append(peak_note(dtype, quick=quick))
    if on_gpu() and not missing:
        return rows, notes
    return rows + flax_attention_rows(quick), notes
