"""The GPU's code paths, lowered for CUDA on any machine (`lowering_platforms=("cuda",)`
needs no GPU): the bfloat16 train, eval and search steps with cuDNN's
attention and either layer norm trace under the suite's strict dtype promotion, and take
the kernels they are meant to (cuDNN's fused attention, the Pallas norm's Triton calls).
A GPU still runs them for real (tests/test_layer_norm.py, tests/test_attention.py)."""

import functools
import re

import jax
import jax.numpy as jnp
import pytest

import transformer_jax.attention
from cuda_lowering import lowered_for_cuda
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config
from transformer_jax.optim import make_optimizer
from transformer_jax.steps import eval_step, predict_step, train_step
from transformer_jax.train_state import abstract_params, create_train_state

BATCH = {"inputs": jax.ShapeDtypeStruct((4, 16), jnp.int32),
         "targets": jax.ShapeDtypeStruct((4, 16), jnp.int32)}


@pytest.fixture
def cudnn_here(monkeypatch):
    """cuDNN's attention traced on a machine without it: our check of the backend and
    jax's of cuDNN's version (private to jax; this test fails, not skips, if it moves)."""
    from jax._src.cudnn import fused_attention_stablehlo
    monkeypatch.setattr(transformer_jax.attention, "cudnn_unsupported", lambda *a, **k: "")
    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91900)
    monkeypatch.setattr(fused_attention_stablehlo, "check_compute_capability", lambda _: True)


def custom_calls(fn, *args) -> set[str]:
    """The custom calls of `fn(*args)` lowered for CUDA."""
    return set(re.findall(r"custom_call @([\w$.]+)", lowered_for_cuda(fn, *args)))


@pytest.mark.usefixtures("cudnn_here")
@pytest.mark.parametrize("attention,layer_norm", [("cudnn", "xla"), ("reference", "pallas")])
def test_bfloat16_steps_lower_for_cuda_under_strict_promotion(attention, layer_norm):
    """cuDNN's attention and the Pallas layer norm one at a time: without a GPU, JAX 0.12
    lowers cuDNN's only with no abstract GPU and Pallas's Triton kernels only for one, so
    not the two in one program (a GPU runs them together). Not "xla" attention: jax.nn's
    bfloat16 attention, differentiated, does not lower for CUDA under strict promotion
    (its BF16_BF16_F32 dot preset meets a float32 cotangent, and JAX's dot lowering
    promotes the two; JAX 0.10 to 0.12)."""
    config = get_model_config("tiny", vocab_size=64, d_model=64, num_heads=4, dtype="bfloat16",
                              attention_implementation=attention,
                              layer_norm_implementation=layer_norm)
    model = Transformer(config)
    optimizer = make_optimizer(d_model=64, warmup_steps=10)
    state = jax.eval_shape(lambda: create_train_state(model, optimizer.tx, jax.random.key(0)))
    train = functools.partial(train_step, model=model, seed=0, label_smoothing=0.1,
                              learning_rate_fn=optimizer.learning_rate_fn)
    triton = {"__gpu$xla.gpu.triton"} if layer_norm == "pallas" else set()
    in_train = custom_calls(train, state, BATCH)
    assert any(name.startswith("__cudnn$fmha") for name in in_train) == (attention == "cudnn")
    assert triton <= in_train
    params = abstract_params(model)
    for loss_chunk_size in (0, 16):
        step = functools.partial(eval_step, model=model, loss_chunk_size=loss_chunk_size)
        assert triton <= custom_calls(step, params, BATCH)
    for beam_size in (1, 4):
        search = functools.partial(predict_step, model=model, beam_size=beam_size,
                                   max_length=20, alpha=0.6)
        assert triton <= custom_calls(search, params, BATCH["inputs"])
