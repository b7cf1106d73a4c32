"""The `compare` suite: side by side in one run, against what a user would use instead.

1. Our train step against torch.nn.Transformer's (torch_peer.py) with the same
   sizes, batch and threads (torch uses as many threads as the machine has
   cores, as XLA does); `ratio` = our tokens/s over torch's.
2. Our attention ("auto") against Flax's `nn.dot_product_attention`, forward.
"""

import os

import flax.linen as nn
import jax

from transformer_jax.benchmark import attention, model, torch_peer
from transformer_jax.benchmark.flops import train_step_flops
from transformer_jax.benchmark.machine import peak_tflops
from transformer_jax.benchmark.timing import median_seconds


def train_cases(quick: bool) -> list[model.Case]:
    """The issue's CPU targets: base at 8 × 32 and small at 16 × 32 tokens."""
    configs = model.model_configs()
    if quick:
        return [model.Case("tiny", configs["tiny"], 8, 16)]
    return [model.Case("base", configs["base"], 8, 32),
            model.Case("small", configs["small"], 16, 32)]


def torch_row(case: model.Case, *, quick: bool) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
    step = torch_peer.train_step_fn(case.config, model.synthetic_batch(
        case.config, case.batch, case.length), device)
    seconds = median_seconds(step, warmup=1 if quick else 2, iters=2 if quick else 10)
    flops = train_step_flops(case.config, case.batch, case.length, case.length)
    peak, _ = peak_tflops("float32", quick=quick)
    return {"framework": f"torch {torch.__version__} nn.Transformer ({device})",
            "model": case.name,
            "batch": case.batch, "length": case.length, "step_ms": seconds * 1e3,
            "tokens_per_sec": case.batch * case.length / seconds,
            "tflops": flops / seconds / 1e12, "mfu": flops / seconds / 1e12 / peak if peak else None}


def jax_row(case: model.Case, *, quick: bool) -> dict:
    row = model.time_train_step(case, "float32", "pmap", quick=quick)
    return {"framework": "transformer_jax (pmap)", "model": case.name, "batch": case.batch,
            "length": case.length, "step_ms": row["step_ms"],
            "tokens_per_sec": row["tokens_per_sec"], "tflops": row["tflops"], "mfu": row["mfu"]}


def attention_rows(quick: bool) -> list[dict]:
    rows = []
    num_heads, head_dim = (2, 64) if quick else (8, 64)
    flax_attend = lambda q, k, v, mask: nn.dot_product_attention(q, k, v, mask=mask)  # noqa: E731
    for seq_len in (16, 32) if quick else (128, 256, 512):
        shape = dict(batch=max(1, (64 if quick else 2048) // seq_len), seq_len=seq_len,
                     num_heads=num_heads, head_dim=head_dim, dtype="float32", causal=False,
                     backward=False, quick=quick)
        ours, peer = (attention.time_case("auto", **shape),
                      attention.time_case("flax", attend=flax_attend, **shape))
        rows += [{"framework": framework, "batch": row["batch"], "length": seq_len,
                  "step_ms": row["ms"], "tflops": row["tflops"]}
                 for framework, row in (("transformer_jax attention (auto)", ours),
                                        ("flax nn.dot_product_attention", peer))]
        rows[-2]["ratio"] = ours["tflops"] / peer["tflops"]
    return rows


def run(quick: bool = False) -> tuple[list[dict], list[str]]:
    rows, notes = [], ["ratio: ours over the row below it (tokens/s, or TFLOP/s for attention)"]
    missing = torch_peer.torch_available()
    for case in train_cases(quick):
        ours = jax_row(case, quick=quick)
        rows.append(ours)
        if missing:
            continue
        peer = torch_row(case, quick=quick)
        ours["ratio"] = ours["tokens_per_sec"] / peer["tokens_per_sec"]
        rows.append(peer)
    if missing:
        notes.append(f"no PyTorch rows: {missing}")
    return rows + attention_rows(quick), notes
