"""Layer normalization of a residual sum (§3.1, "LayerNorm(x + Sublayer(x))"; Ba et al., 2016):

    LayerNorm(s) = (s - mean(s)) / sqrt(var(s) + ε) · γ + β,   s = x + y, over the last axis

with the mean and variance in float32 and γ (`scale`), β (`bias`) float32 parameters, as
Flax's `nn.LayerNorm` computes it. `add_layer_norm` is the function, `LayerNorm` the module
(the parameters of `nn.LayerNorm`: "scale" and "bias", so checkpoints move between the two).

Three implementations (`ModelConfig.layer_norm_implementation`):

    "xla"      `nn.LayerNorm` of x + y: XLA fuses the passes as it sees fit (the default).
    "pallas"   one Pallas kernel reads x and y and writes LayerNorm(x + y) and each row's mean
               and 1/σ; the gradient is one more, which reads x, y and the output's gradient
               and writes the sum's gradient and each row block's share of γ's and β's. On a
               GPU it compiles through Triton; elsewhere it runs in Pallas's interpreter
               (for tests: slow).
    "tokamax"  tokamax's `layer_norm` of x + y, its Triton kernel on a GPU (which needs
               the jax-triton tokamax was built against: tokamax 0.0.17's kernel does not
               run with jax-triton 0.3.1, PyPI's newest, and says so) and its XLA one
               elsewhere: the library's kernel, to time beside ours (`pip install tokamax`:
               Python 3.12, jax 0.11).

"pallas" is written by hand because no library at hand fuses the residual's add with the
norm in both passes: XLA's cuDNN layer norm (`--xla_gpu_enable_cudnn_layer_norm`) and
tokamax's Triton kernel normalize one array that the add has written first (tokamax 0.0.17
refuses a computed input, `Callable x is not supported`). Timed on an H100 (base's step,
bfloat16, side by side: BENCHMARKS.md, "GPU: H100, 2026-11-26, second run"), "pallas" took
40.0 ms and "xla" 40.1 ms, and cuDNN's norm 39.8 ms in a process of its own: no gain worth a
hand-written kernel, so "xla" stays the default. JAX 0.12
deprecates Pallas's Triton backend (for Mosaic GPU, or Triton's own bindings through
jax_triton): a kernel kept here moves to one of those before JAX drops it.
The kernels see every position as a row: `x_RD` is `(B·T, D)`, R rows.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from transformer_jax.model_config import LAYER_NORM_IMPLEMENTATIONS
# Elements per program of the Pallas kernels: 16 rows of base's 512 (32 KiB in float32),
# 8 of big's 1,024, so that a row block's float32 copies fit one program's registers.
_ELEMENTS = 8192


def _block_rows(rows: int, width: int) -> int:
    """Rows per program: a power of two dividing `rows`, `_ELEMENTS` // `width` at most."""
    return math.gcd(rows, max(1, _ELEMENTS // width))


def add_layer_norm(x, y, scale, bias, *, epsilon: float, implementation: str = "xla"):
    """The residual connection and layer norm of every sublayer (§3.1, "LayerNorm(x +
    Sublayer(x))", Ba et al. 2016), over the last axis, with y = Sublayer(x):

        LayerNorm(s) = (s - mean(s)) / sqrt(var(s) + ε) · scale + bias,   s = x + y

    statistics in float32, the result in `x`'s dtype; `y` None normalizes `x` alone.
    `scale` and `bias` are `(D,)`, and `x` and `y` `(..., D)` of one shape."""
    if implementation not in LAYER_NORM_IMPLEMENTATIONS:
        raise ValueError(f"layer norm implementation must be one of "
                         f"{LAYER_NORM_IMPLEMENTATIONS}, got {implementation!r}")
    if y is not None and jnp.shape(x) != jnp.shape(y):
        raise ValueError(f"x {jnp.shape(x)} and y {jnp.shape(y)} must have one shape: "
                         f"LayerNorm(x + y) adds a sublayer's output to its input")
    if implementation == "xla":
        s = x if y is None else x + y
        norm = nn.LayerNorm(epsilon=epsilon, dtype=x.dtype, param_dtype=jnp.float32)
        # Flax mixes bfloat16 with its float32 statistics itself, which strict promotion refuses.
        with jax.numpy_dtype_promotion("standard"):
            return norm.apply({"params": {"scale": scale, "bias": bias}}, s)
    if implementation == "tokamax":
        return _tokamax(x if y is None else x + y, scale, bias, epsilon)
    width = x.shape[-1]
    if width & (width - 1):
        raise ValueError(f"the pallas layer norm needs a power-of-two width (Triton's "
                         f"blocks), got {width}; use implementation='xla'")
    x_RD = x.reshape(-1, width)
    # Pre-norm (`pre_layer_norm`) normalizes x alone: the kernel reads zeros for y.
    y_RD = jnp.zeros_like(x_RD) if y is None else y.reshape(-1, width).astype(x.dtype)
    return _fused(x_RD, y_RD, scale, bias, epsilon).reshape(x.shape)


class LayerNorm(nn.Module):
    """`add_layer_norm` as a module (§3.1, "LayerNorm(x + Sublayer(x))"), with
    `nn.LayerNorm`'s parameters: `norm(x, y)` is LayerNorm(x + y), `norm(x)` LayerNorm(x),

        LayerNorm(s) = (s - mean(s)) / sqrt(var(s) + ε) · scale + bias."""

    epsilon: float = 1e-6
    implementation: str = "xla"

    @nn.compact
    def __call__(self, x, y=None):
        width = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (width,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (width,), jnp.float32)
        return add_layer_norm(x, y, scale, bias, epsilon=self.epsilon,
                              implementation=self.implementation)


def _tokamax(s, scale, bias, epsilon):
    """tokamax's layer norm of the sum: its Triton kernel on a GPU, its XLA one elsewhere."""
    try:
        import tokamax
    except ImportError:
        raise ValueError("layer norm implementation 'tokamax' needs tokamax (pip install "
                         "tokamax; Python 3.12 and jax 0.11 or newer)") from None
    kernel = "triton" if jax.default_backend() == "gpu" else "xla"
    try:
        with jax.numpy_dtype_promotion("standard"):  # as for Flax's: its float32 statistics
            return tokamax.layer_norm(s, scale, bias, epsilon=epsilon, implementation=kernel)
    except TypeError as error:
        if "triton_call()" not in str(error):
            raise
        # Seen on an H100: tokamax 0.0.17 passes `out_type=` to jax_triton.triton_call, which
        # jax-triton 0.3.1, PyPI's newest, calls `out_shape`.
        raise ValueError(f"layer norm implementation 'tokamax' cannot run its Triton kernel "
                         f"with this jax-triton ({error}): install the jax-triton that this "
                         f"tokamax was built against, or use 'xla' or 'pallas'") from error


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused(x_RD, y_RD, scale_D, bias_D, epsilon):
    return _forward(x_RD, y_RD, scale_D, bias_D, epsilon)[0]


def _call(kernel, out_shape, rows: int, width: int, in_specs, out_specs, name: str):
    """`kernel` over blocks of `_block_rows` rows: Triton on an NVIDIA GPU, Pallas's
    interpreter elsewhere, chosen for the platform the caller is compiled for (a GPU host's
    CPU devices interpret)."""
    block = _block_rows(rows, width)

    def call(interpret: bool):
        # Imported here, when the kernels are built: not every jaxlib has Triton's bindings.
        from jax.experimental.pallas import triton as plgpu

        return pl.pallas_call(
            functools.partial(kernel, width=width), out_shape=out_shape, grid=(rows // block,),
            in_specs=[spec(block) for spec in in_specs],
            out_specs=[spec(block) for spec in out_specs], interpret=interpret, name=name,
            compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        )

    return lambda *args: lax.platform_dependent(*args, cuda=call(False), default=call(True))


def _rows_spec(width):
    return lambda block: pl.BlockSpec((block, width), lambda i: (i, 0))


def _row_spec(block):
    return pl.BlockSpec((block,), lambda i: (i,))


def _whole_spec(width):
    return lambda block: pl.BlockSpec((width,), lambda i: (0,))


def _partial_spec(width):
    return lambda block: pl.BlockSpec((width,), lambda i: (i,))


def _forward(x_RD, y_RD, scale_D, bias_D, epsilon):
    rows, width = x_RD.shape
    f32 = jax.ShapeDtypeStruct((rows,), jnp.float32)
    call = _call(functools.partial(_forward_kernel, epsilon=epsilon),
                 [jax.ShapeDtypeStruct(x_RD.shape, x_RD.dtype), f32, f32], rows, width,
                 [_rows_spec(width), _rows_spec(width), _whole_spec(width), _whole_spec(width)],
                 [_rows_spec(width), _row_spec, _row_spec], "add_layer_norm")
    out_RD, mean_R, rstd_R = call(x_RD, y_RD, scale_D, bias_D)
    return out_RD, (x_RD, y_RD, scale_D, mean_R, rstd_R)


def _forward_kernel(x_ref, y_ref, scale_ref, bias_ref, out_ref, mean_ref, rstd_ref, *,
                    epsilon, width):
    # The sum in x's dtype, as `nn.LayerNorm(x + y)` is given it. Where XLA fuses the add
    # with the cast it may keep the sum's float32 (the CPU's does, in both paths, jitted).
    s = (x_ref[...] + y_ref[...]).astype(jnp.float32)
    mean = jnp.sum(s, axis=1) / width
    centred = s - mean[:, None]
    rstd = lax.rsqrt(jnp.sum(centred * centred, axis=1) / width + epsilon)
    out = centred * rstd[:, None] * scale_ref[...][None, :] + bias_ref[...][None, :]
    out_ref[...] = out.astype(out_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _backward(epsilon, residuals, dout_RD):
    """d/ds of LayerNorm(s) (the same for x and y), and γ's and β's gradients, summed over
    the row blocks' shares: ds = rstd · (g - mean(g) - ŝ · mean(g · ŝ)), g = dout · γ."""
    del epsilon
    x_RD, y_RD, scale_D, mean_R, rstd_R = residuals
    rows, width = x_RD.shape
    blocks = rows // _block_rows(rows, width)
    shares = jax.ShapeDtypeStruct((blocks * width,), jnp.float32)
    call = _call(_backward_kernel, [jax.ShapeDtypeStruct(x_RD.shape, x_RD.dtype), shares, shares],
                 rows, width,
                 [_rows_spec(width), _rows_spec(width), _whole_spec(width), _row_spec,
                  _row_spec, _rows_spec(width)],
                 [_rows_spec(width), _partial_spec(width), _partial_spec(width)],
                 "add_layer_norm_backward")
    ds_RD, dscale_shares, dbias_shares = call(x_RD, y_RD, scale_D, mean_R, rstd_R,
                                              dout_RD.astype(x_RD.dtype))
    dscale_D = dscale_shares.reshape(blocks, width).sum(0)
    dbias_D = dbias_shares.reshape(blocks, width).sum(0)
    return ds_RD, ds_RD, dscale_D, dbias_D  # d/dx = d/dy = d/ds: y_RD has x's dtype


def _backward_kernel(x_ref, y_ref, scale_ref, mean_ref, rstd_ref, dout_ref, ds_ref,
                     dscale_ref, dbias_ref, *, width):
    s = (x_ref[...] + y_ref[...]).astype(jnp.float32)
    rstd = rstd_ref[...][:, None]
    normed = (s - mean_ref[...][:, None]) * rstd
    dout = dout_ref[...].astype(jnp.float32)
    g = dout * scale_ref[...][None, :]
    mean_g = jnp.sum(g, axis=1)[:, None] / width
    mean_g_normed = jnp.sum(g * normed, axis=1)[:, None] / width
    ds_ref[...] = (rstd * (g - mean_g - normed * mean_g_normed)).astype(ds_ref.dtype)
    dscale_ref[...] = jnp.sum(dout * normed, axis=0)
    dbias_ref[...] = jnp.sum(dout, axis=0)


_fused.defvjp(_forward, _backward)
