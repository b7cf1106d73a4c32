"""The `loss` suite: the tied output layer and the smoothed loss (§3.4, §5.4), forward and
backward, alone: what `config.loss_chunk_size` chooses between, and a library's kernel.

    whole    the logits `(R, V)` whole (`loss_chunk_size=0`), the loss and accuracy of
             `features @ table.T` from `losses.xla_logit_terms`: XLA's reductions over V
    chunks   `output_loss.output_loss`, `chunk` rows at a time, with its hand-written
             gradient (`loss_chunk_size`: 4,096 on accelerators, 512 on CPUs, 16 in --quick)
    2 passes the same from `losses.two_pass_logit_terms`: its reductions over V in two
             passes by construction, with a hand-written gradient (what
             `losses.logit_terms`, and so the train step, runs on GPUs)
    optax    the logits whole, and the loss as one would write it without this package:
             `optax.softmax_cross_entropy` against `optax.smooth_labels` (ε/V on every
             token, a q slightly unlike §5.4's) and `jnp.argmax`'s accuracy
    tokamax  tokamax's `linear_softmax_cross_entropy_loss`, where tokamax is installed: no
             label smoothing, no token weights, no accuracy, so less work than whole and
             chunks and no drop-in for them; it is here to measure what a well-kept kernel
             does with the same matmuls. Its default implementation, and beside it
             "chunked_xla" (blocks of rows and of V, no (R, V) logits) where the installed
             version has it (0.0.17 does; 0.0.12 does not)

Each is the value and gradient (features and table) of the loss's sum, jitted; R target
tokens of width D against V. On accelerators R = 96 × 256 (the base step's batch), D 512,
V 37,000, bfloat16 operands; on CPUs R 2,048, D 256, V 8,000, float32.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer_jax.benchmark import report
from transformer_jax.benchmark.timing import (SPREAD_NOTE, compile_seconds, memory_bytes,
                                              timed_seconds)
from transformer_jax.losses import (is_correct, smoothed_loss, two_pass_logit_terms,
                                    xla_logit_terms)
from transformer_jax.output_loss import output_loss


def cases(quick: bool) -> list[tuple[int, int, int, str, int]]:
    """(R rows, D, V, dtype, rows per chunk)."""
    if quick:
        return [(64, 32, 300, "float32", 16)]
    if jax.default_backend() == "cpu":
        return [(2048, 256, 8000, "float32", 512)]
    return [(96 * 256, 512, 37_000, "bfloat16", 4096)]


def _logits(x_RD, table_VD, dtype):
    """The whole logits `(R, V)`: in the compute dtype, then float32, as
    `Transformer.decode` makes the train step's."""
    return jnp.einsum("RD,VD->RV", x_RD.astype(dtype),
                      table_VD.astype(dtype)).astype(jnp.float32)


def _whole(x_RD, table_VD, targets_R, dtype, logit_terms=xla_logit_terms):
    """The smoothed loss's and the accuracy's sums from the whole logits' `logit_terms`."""
    terms = logit_terms(_logits(x_RD, table_VD, dtype), targets_R)
    loss_R = smoothed_loss(terms, table_VD.shape[0], 0.1)
    return loss_R.sum(), is_correct(terms, targets_R).sum()


def _optax(x_RD, table_VD, targets_R, dtype):
    logits_RV = _logits(x_RD, table_VD, dtype)
    labels_RV = optax.smooth_labels(jax.nn.one_hot(targets_R, table_VD.shape[0]), 0.1)
    correct = (jnp.argmax(logits_RV, axis=-1) == targets_R).sum(dtype=jnp.float32)
    return optax.softmax_cross_entropy(logits_RV, labels_RV).sum(), correct


def _chunks(x_RD, table_VD, targets_R, dtype, chunk):
    loss, _, correct = output_loss(x_RD, table_VD, targets_R, label_smoothing=0.1,
                                   chunk_size=chunk, dtype=dtype)
    return loss, correct


def _tokamax(x_RD, table_VD, targets_R, dtype, implementation=None):
    import tokamax

    loss = tokamax.linear_softmax_cross_entropy_loss(
        x_RD.astype(dtype), targets_R, table_VD.astype(dtype).T, reduction="sum",
        implementation=implementation)
    return loss, jnp.zeros((), jnp.float32)


def _tokamax_implementations() -> list[str]:
    """tokamax's implementations of the loss besides its default, where it has them."""
    from tokamax._src.ops.linear_softmax_cross_entropy_loss import api

    return [name for name in ("chunked_xla",) if name in api.IMPLEMENTATIONS]


def methods(chunk: int) -> tuple[dict, list[str]]:
    """{name: loss function}, and notes on what could not run here."""
    found = {"whole": _whole, "chunks": functools.partial(_chunks, chunk=chunk),
             "2 passes": functools.partial(_whole, logit_terms=two_pass_logit_terms),
             "optax": _optax}
    try:
        import tokamax  # noqa: F401
    except ImportError:
        return found, ["tokamax: not installed (pip install tokamax)"]
    from absl import flags

    # tokamax 0.0.12 reads its options as absl flags, parsing sys.argv on first use; here
    # sys.argv holds this command's own arguments (--quick), which absl would refuse.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    found["tokamax"] = _tokamax
    for name in _tokamax_implementations():
        found[f"tokamax {name}"] = functools.partial(_tokamax, implementation=name)
    return found, []


def time_method(fn, rows: int, width: int, vocab: int, dtype: str, chunk: int, *,
                quick: bool) -> dict:
    rng = np.random.default_rng(0)
    x_RD = jnp.asarray(rng.normal(size=(rows, width)), jnp.float32)
    table_VD = jnp.asarray(rng.normal(size=(vocab, width)) * width ** -0.5, jnp.float32)
    targets_R = jnp.asarray(rng.integers(1, vocab, rows), jnp.int32)
    step = jax.jit(jax.value_and_grad(lambda x, t: fn(x, t, targets_R, jnp.dtype(dtype)),
                                      argnums=(0, 1), has_aux=True))
    compiled, compile_s = compile_seconds(step, x_RD, table_VD)
    timed = timed_seconds(lambda: jax.block_until_ready(compiled(x_RD, table_VD)),
                          warmup=1 if quick else 2, iters=3 if quick else 10)
    seconds = timed.median
    flops = 6 * rows * width * vocab  # logits, then d(features) and d(table)
    return {"rows": rows, "d_model": width, "vocab": vocab, "dtype": dtype, "chunk": chunk,
            "ms": seconds * 1e3, **timed.columns(), "tflops": flops / seconds / 1e12,
            "compile_s": compile_s,
            "memory_bytes": memory_bytes(compiled)}


def run(quick: bool = False) -> tuple[list[dict], list[str]]:
    """(rows, notes): each way of computing the output layer and loss (`methods`) timed on
    each case's rows, with their ratio to the whole-logits way."""
    rows = []
    for case in cases(quick):
        found, notes = methods(chunk=case[-1])
        timed = [report.measured({"method": name, **time_method(fn, *case, quick=quick)})
                 for name, fn in found.items()]
        for row in timed:
            row["vs_whole"] = timed[0]["ms"] / row["ms"]
            if row["method"] != "chunks":  # the others have none, tokamax's are its own
                row["chunk"] = None
        rows += timed
    return rows, notes + [
        "whole: the (R, V) logits whole, XLA's reductions (losses.xla_logit_terms); chunks: "
        "output_loss, the same loss and gradient; 2 passes: the whole logits, their "
        "reductions in two passes (losses.two_pass_logit_terms, the default on GPUs); "
        "optax: the whole logits, optax's smoothed cross-entropy and jnp.argmax; "
        "tokamax: no label smoothing, weights or accuracy",
        "tflops: the nominal 6·R·D·V of the logits and their two gradients",
        "vs_whole: the whole logits' time over this method's", SPREAD_NOTE]
