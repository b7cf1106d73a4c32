"""Pure training, evaluation and prediction steps.

`train_step` and `eval_step` are written for one device's share of a batch:
`parallel.py` runs them under `jax.pmap` (with `axis_name`, so sums cross
devices) or under `jax.jit` on a mesh (global arrays, `axis_name=None`). Both
return sums, not means: the loss is divided by the token count of the whole
global batch, so any split of a batch over devices gives the same update.

`predict_step` is the search a translation runs on one batch of sources
(`predict.py` jits it and runs it on length-sorted batches).
"""

import functools

import jax
import jax.numpy as jnp
import optax

from transformer_jax.decoding import beam_search, greedy_search
from transformer_jax.losses import accuracy, label_smoothed_cross_entropy
from transformer_jax.model import Transformer, cast_matmul_params
from transformer_jax.token_ids import EOS_ID
from transformer_jax.train_state import TrainState

MODEL_KEYS = ("inputs_segmentation", "targets_segmentation", "inputs_positions",
              "targets_positions")


def _apply(params, batch, *, model, deterministic: bool, dropout_key=None, **kwargs):
    """`model.apply` on a batch's inputs, targets and packing; `kwargs` may name another
    method than `__call__` (the logits) and its arguments."""
    packing = {key: batch[key] for key in MODEL_KEYS if key in batch}
    rngs = None if deterministic else {"dropout": dropout_key}
    return model.apply({"params": params}, batch["inputs"], batch["targets"], **packing,
                       deterministic=deterministic, rngs=rngs, **kwargs)


def _psum(tree, axis_name):
    """The sum over the devices of pmap's axis; none where there is no axis or it has one
    device. XLA's CPU backend kept a one-device all-reduce: a copy of every gradient between
    the backward's fusions and Adam's (base: 286 MB, 4-10 % of the step on a 2-core CPU)."""
    if axis_name is None or jax.lax.axis_size(axis_name) == 1:
        return tree
    return jax.lax.psum(tree, axis_name)


def dropout_key(seed: int, step, axis_name=None):
    """Dropout randomness from (seed, step): a resumed run needs no saved key.

    Under pmap every device folds in its index, so devices draw different masks.
    """
    key = jax.random.fold_in(jax.random.key(seed), step)
    if axis_name is not None:
        key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
    return key


def train_step(state: TrainState, batch, *, model, seed: int, label_smoothing: float,
               learning_rate_fn, accumulation_steps: int = 1, loss_chunk_size: int = 0,
               axis_name=None):
    """One optimizer update on a batch of packed rows (B, L); returns (state, metrics).

    With `accumulation_steps` k > 1 the batch is split into k micro-batches of
    B / k rows (every k-th row) whose gradients are summed before the one update: the
    same update as the whole batch at a k-th of the activation memory (how the
    paper's 25k-token batches fit fewer devices).

    With `loss_chunk_size` > 0 the output layer and the loss run that many target
    tokens at a time (`output_loss.py`): the same sums and gradients, without the whole
    `(B, T, V)` logits.

    Metrics are sums over the global batch: `loss_sum`, `weight_sum` (target
    tokens), `correct_sum`; and `grad_norm`, `learning_rate` of this update.
    """
    key = dropout_key(seed, state.step, axis_name)

    def micro_step(carry, micro):
        index, micro_batch = micro
        grad_fn = jax.grad(_loss_and_counts, has_aux=True)
        grads, counts = grad_fn(state.params, micro_batch, model=model,
                                label_smoothing=label_smoothing, chunk_size=loss_chunk_size,
                                dropout_key=jax.random.fold_in(key, index))
        return jax.tree.map(jnp.add, carry, (grads, counts)), None

    # Micro-batch k holds rows k, k + A, k + 2A, ... (A = accumulation_steps): under
    # `sharded` each device's rows are a contiguous block of the batch, and so each holds a
    # share of every micro-batch. Contiguous micro-batches each lay on some devices: XLA
    # gathered them, and every device ran each one whole (no memory saved, work repeated).
    micro_batches = jax.tree.map(
        lambda x: x.reshape((-1, accumulation_steps) + x.shape[1:]).swapaxes(0, 1), batch)
    zeros = (jax.tree.map(jnp.zeros_like, state.params),
             {"loss_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0})
    (grads, counts), _ = jax.lax.scan(
        micro_step, zeros, (jnp.arange(accumulation_steps), micro_batches))
    grads, counts = _psum((grads, counts), axis_name)
    # The gradient of the mean loss over every target token of the global batch.
    grads = jax.tree.map(lambda g: g / jnp.maximum(counts["weight_sum"], 1.0), grads)
    metrics = dict(counts, grad_norm=optax.tree.norm(grads),
                   learning_rate=learning_rate_fn(state.step))
    # Named for profiles (`profiling.summarize_parts`), as the loss is.
    with jax.named_scope("optimizer"), jax.numpy_dtype_promotion("standard"):
        return state.apply_gradients(grads=grads), metrics  # Adam: a float to an int32 power


def _loss_and_counts(params, batch, *, model, label_smoothing, chunk_size, dropout_key):
    """The summed smoothed loss (differentiated) and, as aux, the counts to log."""
    counts = _counts(params, batch, model=model, label_smoothing=label_smoothing,
                     chunk_size=chunk_size, deterministic=False, dropout_key=dropout_key)
    return counts["loss_sum"], counts


def _counts(params, batch, *, model, label_smoothing, chunk_size, deterministic,
            dropout_key=None) -> dict:
    """loss_sum, weight_sum, correct_sum of a batch: from the whole logits, or
    `chunk_size` target tokens at a time (`Transformer.loss`)."""
    run = dict(model=model, deterministic=deterministic, dropout_key=dropout_key)
    if chunk_size:
        sums = _apply(params, batch, **run, method=Transformer.loss,
                      label_smoothing=label_smoothing, chunk_size=chunk_size)
        return dict(zip(("loss_sum", "weight_sum", "correct_sum"), sums))
    logits_BTV = _apply(params, batch, **run)
    with jax.named_scope("loss"):
        loss_sum, weight_sum = label_smoothed_cross_entropy(
            logits_BTV, batch["targets"], label_smoothing=label_smoothing)
        correct_sum, _ = accuracy(logits_BTV, batch["targets"])
    return {"loss_sum": loss_sum, "weight_sum": weight_sum, "correct_sum": correct_sum}


def eval_step(params, batch, *, model, loss_chunk_size: int = 0, axis_name=None):
    """Sums over an evaluation batch: plain cross-entropy (no smoothing) and accuracy.

    Rows that only pad the batch have all-zero targets, so they weigh nothing.
    """
    counts = _counts(params, batch, model=model, label_smoothing=0.0,
                     chunk_size=loss_chunk_size, deterministic=True)
    return _psum(counts, axis_name)


def predict_step(params, inputs_BS, *, model, beam_size: int, max_length: int, alpha: float):
    """Output ids `(B, max_length)`: greedy search (`beam_size` 1) or beam search (§6.1).

    Encodes once, projects the cross-attention keys and values once (`init_cache`),
    then decodes one token per step with the cache; the matrices are cast to the compute
    dtype once, before the loop (`cast_matmul_params`).
    """
    variables = {"params": cast_matmul_params(params, model.config.compute_dtype)}
    memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    cache = model.apply(variables, memory_BSD, inputs_BS, max_length,
                        method=Transformer.init_cache)
    step = functools.partial(model.apply, variables, method=Transformer.decode_step)
    batch = inputs_BS.shape[0]
    if beam_size == 1:
        return greedy_search(step, cache, batch_size=batch, max_length=max_length,
                             eos_id=EOS_ID)
    return beam_search(step, cache, batch_size=batch, beam_size=beam_size,
                       max_length=max_length, alpha=alpha, eos_id=EOS_ID)[0]
