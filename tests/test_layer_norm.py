"""LayerNorm(x + y) (layer_norm.py): each implementation against NumPy in float64 and
against autodiff, nn.LayerNorm's parameters, the model and its step with the Pallas kernels
(run by Pallas's interpreter on a CPU), and clear errors. tokamax's are tested where tokamax
is installed (Python 3.12, jax 0.11: the GPU host)."""

import dataclasses
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cuda_lowering import lowered_for_cuda
from transformer_jax.layer_norm import LAYER_NORM_IMPLEMENTATIONS, LayerNorm, add_layer_norm
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig, get_model_config
from transformer_jax.steps import train_step
from transformer_jax.optim import make_optimizer
from transformer_jax.train_state import create_train_state

EPS = 1e-6


def needs(implementation: str) -> None:
    if implementation != "tokamax":
        return
    pytest.importorskip("tokamax", reason="tokamax is optional (pip install tokamax)")
    x, y, scale, bias, _ = inputs((2, 8))
    try:
        add_layer_norm(x, y, scale, bias, epsilon=EPS, implementation="tokamax")
    except ValueError as error:  # tokamax's Triton kernel and this jax-triton disagree
        pytest.skip(str(error))


def inputs(shape, seed=0, dtype=jnp.float32):
    """x (mean 1, σ 3: the mean matters), y, scale, bias and an output gradient."""
    rng = np.random.default_rng(seed)
    width = shape[-1]
    x = rng.normal(1.0, 3.0, shape)
    y, dout = rng.normal(size=shape), rng.normal(size=shape)
    scale, bias = 1 + 0.3 * rng.normal(size=width), 0.3 * rng.normal(size=width)
    return (jnp.asarray(x, dtype), jnp.asarray(y, dtype), jnp.asarray(scale, jnp.float32),
            jnp.asarray(bias, jnp.float32), jnp.asarray(dout, dtype))


def numpy_layer_norm(s, scale, bias):
    s = np.float64(s)
    mean, var = s.mean(-1, keepdims=True), s.var(-1, keepdims=True)
    return (s - mean) / np.sqrt(var + EPS) * np.float64(scale) + np.float64(bias)


def value_and_grads(implementation, x, y, scale, bias, dout):
    """LayerNorm(x + y) and the gradients of Σ out · dout for x, y, scale, bias."""
    def f(x, y, scale, bias):
        return add_layer_norm(x, y, scale, bias, epsilon=EPS, implementation=implementation)
    out, vjp = jax.vjp(f, x, y, scale, bias)
    return out, vjp(dout)


def formula_grads(x, y, scale, bias, dout):
    """Autodiff of the formula written out in jnp, float32: what the hand-written backward
    kernel must equal."""
    def f(x, y, scale, bias):
        s = x + y
        mean = s.mean(-1, keepdims=True)
        var = ((s - mean) ** 2).mean(-1, keepdims=True)
        lead = (1,) * (s.ndim - 1)
        return (s - mean) * jax.lax.rsqrt(var + EPS) * scale.reshape(*lead, -1) \
            + bias.reshape(*lead, -1)
    return jax.vjp(f, x, y, scale, bias)[1](dout)


@pytest.mark.parametrize("implementation", LAYER_NORM_IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", [(2, 16, 64), (3, 7, 32), (5, 128)])
def test_value_and_gradients_in_float32(implementation, shape):
    """Rows in blocks of 16, and row counts with no such divisor (21, 5)."""
    needs(implementation)
    x, y, scale, bias, dout = inputs(shape)
    out, grads = value_and_grads(implementation, x, y, scale, bias, dout)
    np.testing.assert_allclose(out, numpy_layer_norm(np.float64(x) + np.float64(y), scale,
                                                     bias), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, formula_grads(x, y, scale, bias, dout)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    dx, dy = grads[:2]
    np.testing.assert_array_equal(dx, dy)  # s = x + y
    # Each row's gradient is orthogonal to the constant and to the normalized row:
    # LayerNorm ignores a shift and a scale of s.
    assert np.abs(np.asarray(dx).sum(-1)).max() < 1e-4 * np.abs(np.asarray(dx)).max() * shape[-1]


@pytest.mark.parametrize("implementation", LAYER_NORM_IMPLEMENTATIONS)
def test_y_none_normalizes_x_alone(implementation):
    needs(implementation)
    x, _, scale, bias, _ = inputs((4, 16, 32))
    out = add_layer_norm(x, None, scale, bias, epsilon=EPS, implementation=implementation)
    np.testing.assert_allclose(out, numpy_layer_norm(x, scale, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", LAYER_NORM_IMPLEMENTATIONS)
def test_epsilon_is_added_to_the_variance_inside_the_square_root(implementation):
    """ε = 1, by hand: [0, 2, 0, 2] (mean 1, variance 1) gives ±1 / √(1 + 1), and
    [1, 1, 1, 5] (mean 2, variance 3) gives [-1, -1, -1, 3] / √(3 + 1). With x + y and
    with x alone (y None: normalizing 2x instead would give ±2 / √5 in the first row)."""
    needs(implementation)
    s_RD = np.array([[0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 5.0]], np.float32)
    expected_RD = np.array([[-1, 1, -1, 1], [-0.5, -0.5, -0.5, 1.5]]) \
        * np.array([[2**-0.5], [1.0]])
    scale_D, bias_D = jnp.ones(4), jnp.zeros(4)
    y_RD = np.array([[0.5, -1.0, 2.0, 0.0], [3.0, 0.0, -1.0, 1.0]], np.float32)
    for x, y in ((s_RD - y_RD, y_RD), (s_RD, None)):
        out_RD = add_layer_norm(jnp.asarray(x), None if y is None else jnp.asarray(y), scale_D,
                                bias_D, epsilon=1.0, implementation=implementation)
        np.testing.assert_allclose(out_RD, expected_RD, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("implementation", ["pallas", "tokamax"])
def test_bfloat16_kernels_agree_with_xla_to_its_rounding(implementation):
    """The sum in bfloat16 in both (XLA may keep its float32 where it fuses the cast);
    statistics in float32; the outputs differ by at most one bfloat16 rounding (2⁻⁸
    relative), the gradients by a few."""
    needs(implementation)
    x, y, scale, bias, dout = inputs((4, 32, 128), dtype=jnp.bfloat16)
    out_xla, grads_xla = value_and_grads("xla", x, y, scale, bias, dout)
    out_pallas, grads_pallas = value_and_grads(implementation, x, y, scale, bias, dout)
    assert out_pallas.dtype == out_xla.dtype == jnp.bfloat16
    assert [g.dtype for g in grads_pallas] == [g.dtype for g in grads_xla]
    f32 = np.float32
    np.testing.assert_allclose(f32(out_pallas), f32(out_xla), rtol=2**-7, atol=2**-7)
    for got, want in zip(grads_pallas, grads_xla):
        scale_of = np.abs(f32(want)).max()
        assert np.abs(f32(got) - f32(want)).max() < 2**-6 * scale_of


def test_the_module_has_flax_layer_norms_parameters():
    """Same names, shapes, dtypes and initial values as nn.LayerNorm: a checkpoint of one
    loads in the other, and the "xla" implementation computes exactly what it did."""
    x = inputs((2, 3, 8))[0]
    ours = LayerNorm().init(jax.random.key(0), x)
    flax_ones = nn.LayerNorm(epsilon=EPS, param_dtype=jnp.float32).init(jax.random.key(0), x)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), ours) == \
        jax.tree.map(lambda a: (a.shape, a.dtype), flax_ones)
    jax.tree.map(np.testing.assert_array_equal, ours, flax_ones)
    params = {"params": {"scale": jnp.arange(1.0, 9.0), "bias": jnp.arange(8.0) / 8}}
    np.testing.assert_array_equal(LayerNorm().apply(params, x),
                                  nn.LayerNorm(epsilon=EPS).apply(params, x))


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_the_train_step_with_the_kernels_equals_the_xla_norms(pre_layer_norm):
    """One update of the tiny model (one layer each side), dropout on: the same loss,
    gradient norm and parameters with the Pallas kernels as with nn.LayerNorm (same masks:
    one key)."""
    # Adam's eps 1e-3, not 1e-9: the key projections' biases have an exactly zero gradient,
    # whose rounding noise Adam's first step would scale to a whole step (test_parallel.py).
    optimizer = make_optimizer(d_model=32, warmup_steps=10, eps=1e-3)
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(1, 50, (4, 9)).astype(np.int32),
             "targets": rng.integers(1, 50, (4, 8)).astype(np.int32)}
    results = []
    for implementation in ("xla", "pallas"):
        config = get_model_config("tiny", vocab_size=50, num_layers=1,
                                  pre_layer_norm=pre_layer_norm,
                                  layer_norm_implementation=implementation)
        model = Transformer(config)
        state = create_train_state(model, optimizer.tx, jax.random.key(0))
        step = jax.jit(lambda s, b, model=model: train_step(
            s, b, model=model, seed=0, label_smoothing=0.1,
            learning_rate_fn=optimizer.learning_rate_fn))
        results.append(step(state, batch))
    (xla_state, xla_metrics), (pallas_state, pallas_metrics) = results
    for key in ("loss_sum", "grad_norm"):
        np.testing.assert_allclose(pallas_metrics[key], xla_metrics[key], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 pallas_state.params, xla_state.params)


def test_bad_implementation_and_width_are_refused_in_one_line():
    x, y, scale, bias, _ = inputs((2, 3, 8))
    with pytest.raises(ValueError, match="must be one of .*'tokamax'\\), got 'triton'"):
        add_layer_norm(x, y, scale, bias, epsilon=EPS, implementation="triton")
    x, y, scale, bias, _ = inputs((2, 3, 6))
    with pytest.raises(ValueError, match="power-of-two width .*got 6"):
        add_layer_norm(x, y, scale, bias, epsilon=EPS, implementation="pallas")
    with pytest.raises(ValueError, match=r"^x \(2, 3, 6\) and y \(2, 3, 4\) must have one "
                                         r"shape: LayerNorm\(x \+ y\) adds"):
        add_layer_norm(x, y[..., :4], scale, bias, epsilon=EPS)
    with pytest.raises(ValueError, match="layer_norm_implementation must be one of"):
        ModelConfig(layer_norm_implementation="cudnn")
    with pytest.raises(ValueError, match="d_model must be a power of two for layer_norm_impl"):
        dataclasses.replace(get_model_config("tiny"), d_model=48, num_heads=4,
                            layer_norm_implementation="pallas")


def test_tokamax_with_another_jax_triton_is_one_clear_error(monkeypatch):
    """tokamax 0.0.17's Triton kernel with jax-triton 0.3.1, as on an H100: a ValueError that
    says what to do, from the TypeError of jax_triton's call."""
    def layer_norm(*args, implementation, **kwargs):
        assert implementation == "triton"
        raise TypeError("triton_call() missing 1 required keyword-only argument: 'out_shape'")

    monkeypatch.setitem(sys.modules, "tokamax", types.SimpleNamespace(layer_norm=layer_norm))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    x, y, scale, bias, _ = inputs((4, 8))
    with pytest.raises(ValueError, match=r"cannot run its Triton kernel with this jax-triton "
                                         r"\(triton_call\(\) missing .*'out_shape'\).*'pallas'"):
        add_layer_norm(x, y, scale, bias, epsilon=EPS, implementation="tokamax")


def test_tokamax_missing_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokamax", None)  # as where it is not installed
    x, y, scale, bias, _ = inputs((2, 3, 8))
    with pytest.raises(ValueError, match="'tokamax' needs tokamax \\(pip install tokamax"):
        add_layer_norm(x, y, scale, bias, epsilon=EPS, implementation="tokamax")


@pytest.mark.parametrize("width", [512, 1024])  # base's and big's
def test_the_kernels_lower_to_triton_for_a_gpu_on_any_machine(width):
    """JAX lowers Pallas kernels to Triton's IR itself, so a CPU can lower the value and
    gradient for CUDA (`lowering_platforms`, no GPU needed): both kernels become Triton
    custom calls. A Triton lowering error (an unsupported operation, a block shape) fails
    here."""
    x, y, scale, bias, _ = inputs((4, 32, width), dtype=jnp.bfloat16)

    def value_and_grad(x, y):
        return jax.value_and_grad(lambda x, y: jnp.sum(add_layer_norm(
            x, y, scale, bias, epsilon=EPS, implementation="pallas").astype(jnp.float32)),
            argnums=(0, 1))(x, y)

    module = lowered_for_cuda(value_and_grad, x, y)
    assert module.count("stablehlo.custom_call @__gpu$xla.gpu.triton") == 2
    assert 'name = "add_layer_norm"' in module and 'name = "add_layer_norm_backward"' in module


@pytest.mark.skipif(jax.default_backend() != "gpu",
                    reason="the kernels compile through Triton on an NVIDIA GPU; this backend "
                           "runs them in Pallas's interpreter")
def test_on_a_gpu_the_kernels_are_triton_calls_and_agree_with_xla():
    """Base's width in bfloat16: the compiled value and gradient hold Triton custom calls
    (not the interpreter's loops), and agree with nn.LayerNorm's to bfloat16's rounding."""
    x, y, scale, bias, dout = inputs((8, 64, 512), dtype=jnp.bfloat16)

    def loss(implementation):
        return jax.jit(jax.grad(lambda x, y: jnp.sum(add_layer_norm(
            x, y, scale, bias, epsilon=EPS, implementation=implementation).astype(jnp.float32)
            * dout.astype(jnp.float32)), argnums=(0, 1)))

    assert "xla.gpu.triton" in loss("pallas").lower(x, y).compile().as_text()
    for got, want in zip(loss("pallas")(x, y), loss("xla")(x, y)):
        got, want = np.float32(got), np.float32(want)
        assert np.abs(got - want).max() < 2**-6 * np.abs(want).max()
