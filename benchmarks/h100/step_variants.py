"""The `model` suite's base step in several variants, each compiled once, then timed in turns
(round after round in one process), so that each ratio to the current code is side by side:

    python benchmarks/h100/step_variants.py FILE.json [--quick] [--rounds=3]
        [--variants=current,...]

Variants (`--variants`, names separated by commas; "current" is always timed, first):
  "current"                 the current code
  "XLA's reductions", "two passes"
                            the logits' reductions by XLA or in two passes
                            (`losses.logit_terms` replaced by `losses.xla_logit_terms` or
                            `losses.two_pass_logit_terms` while the step is traced: since
                            2026-11-27 GPUs run the second by default)
  "no attention biases"     the attention projections without biases (`attention_bias=False`,
                            as §3.2.2 writes them)
  "cublaslt"                XLA with cuBLASLt (`xla_gpu_enable_cublaslt`)
  "triton gemm any"         Triton for every matmul XLA can give it (`xla_gpu_triton_gemm_any`),
                            which may fuse the elementwise passes around them
  "block-level fusions"     XLA's block-level fusion rewriter, which gives Triton the fusions
                            it can tile (reductions such as the layer norms' among them)
  "triton gemm any + block-level fusions"
  "adam over one vector"    Adam over all parameters as one vector (`optax.flatten`;
                            0.88-0.98 x on the 2-core CPU, BENCHMARKS.md)
Without `--variants`, the first five, as run on 2026-11-27. XLA's options are checked
before anything compiles (an option this jaxlib's XLA lacks is one error). bfloat16, the
default strategy, whole logits, packed rows.
(`model-step-variants.json` was written before the two passes became the default: its
"current" is XLA's reductions, its "two passes" the same code as the two passes here.)
"""
import argparse
import contextlib
import statistics

import jax
import optax

from transformer_jax import losses, optim
from transformer_jax.benchmark import model as suite, report
from transformer_jax.benchmark.flops import train_step_flops
from transformer_jax.benchmark.machine import peak_note, peak_tflops
from transformer_jax.benchmark.timing import median_seconds, memory_bytes


@contextlib.contextmanager
def logit_terms_as(replacement):
    """`losses.logit_terms` replaced while a step is traced and compiled."""
    current = losses.logit_terms
    losses.logit_terms = replacement
    try:
        yield
    finally:
        losses.logit_terms = current


@contextlib.contextmanager
def adam_over_one_vector():
    """The suite's optimizer as `optax.flatten` of the paper's Adam while a step is built."""
    def flattened(**kwargs):
        adam = optim.make_optimizer(**kwargs)
        return adam._replace(tx=optax.flatten(adam.tx))

    current = suite.make_optimizer
    suite.make_optimizer = flattened
    try:
        yield
    finally:
        suite.make_optimizer = current


TRITON_GEMM = "xla_gpu_triton_gemm_any"
BLOCK_LEVEL = "xla_gpu_experimental_enable_fusion_block_level_rewriter"
VARIANTS = {  # name: (ModelConfig fields or XLA's options, context while compiling)
    "current": ({}, contextlib.nullcontext),
    "XLA's reductions": ({}, lambda: logit_terms_as(losses.xla_logit_terms)),
    "two passes": ({}, lambda: logit_terms_as(losses.two_pass_logit_terms)),
    "no attention biases": ({"attention_bias": False}, contextlib.nullcontext),
    "cublaslt": ({"xla_gpu_enable_cublaslt": True}, contextlib.nullcontext),
    "triton gemm any": ({TRITON_GEMM: True}, contextlib.nullcontext),
    "block-level fusions": ({BLOCK_LEVEL: True}, contextlib.nullcontext),
    "triton gemm any + block-level fusions": ({TRITON_GEMM: True, BLOCK_LEVEL: True},
                                              contextlib.nullcontext),
    "adam over one vector": ({}, adam_over_one_vector),
}
FIRST_RUN = list(VARIANTS)[:5]  # the variants of 2026-11-27


def compiled_variant(case, dtype, strategy, fields, context, quick):
    """(config, `run_once`, compile seconds, planned memory) of one variant."""
    with context():
        config, _, step, compile_s, _, run_once = suite.compiled_step(
            case, dtype, strategy, quick=quick, packed=jax.default_backend() != "cpu",
            fields=fields)
    return config, run_once, compile_s, memory_bytes(step)


def main(path: str, quick: bool, rounds: int, names: list[str]) -> None:
    for field in {field for name in names for field in VARIANTS[name][0]}:
        if field.startswith("xla_"):
            try:
                suite.xla_option(field, "true")
            except ValueError as error:  # an option this jaxlib's XLA lacks, in XLA's words
                raise SystemExit(f"error: {error}") from None
    case = suite.cases(quick)[-1 if quick else 0]  # base on accelerators
    dtype, strategy = "bfloat16", suite.default_strategies()[0]
    built = {name: compiled_variant(case, dtype, strategy, *VARIANTS[name], quick)
             for name in ["current", *(n for n in names if n != "current")]}
    queued = suite.queued_steps(quick)
    times = {name: [] for name in built}
    for _ in range(rounds):
        for name, (_, run, _, _) in built.items():
            times[name].append(median_seconds(run, warmup=1 if quick else 2,
                                              iters=3 if quick else 10) / queued)
    peak, _ = peak_tflops(dtype, quick=quick)
    rows = []
    for name, (config, _, compile_s, memory) in built.items():
        seconds = statistics.median(times[name])
        flops = train_step_flops(config, case.batch, case.length, case.length)
        rows.append({"variant": name, "model": case.name, "dtype": dtype, "strategy": strategy,
                     "batch": case.batch, "length": case.length,
                     "step_ms": seconds * 1e3, "round_ms": [t * 1e3 for t in times[name]],
                     "vs_current": statistics.median(times["current"]) / seconds,
                     "mfu": flops / seconds / 1e12 / peak if peak else None,
                     "compile_s": compile_s, "memory_bytes": memory})
    notes = [peak_note(dtype, quick=quick), "step_ms: the median of the rounds' medians; "
             "round_ms: each round's; vs_current: the current code's step_ms over this "
             "variant's"]
    print(report.table([{k: v for k, v in row.items() if k != "round_ms"} for row in rows]))
    report.write_json(path, report.document("model", rows, quick=quick, notes=notes))


def variant_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"no variant {unknown}; the variants: {list(VARIANTS)}")
    return names


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", type=variant_names, default=FIRST_RUN)
    args = parser.parse_args()
    main(args.json, args.quick, args.rounds, args.variants)
