"""Scaled dot-product attention (§3.2.1) and its registry of implementations.

Pure JAX, no Flax. `dot_product_attention` takes jax.nn.dot_product_attention's
arguments, in its order (query, key, value, bias, mask, then scale and is_causal by
keyword), and every implementation has one signature,

    fn(query, key, value, bias, mask, *, scale, is_causal, dropout_rate, dropout_rng)

on query `(B, T, N, H)`, key and value `(B, S, N, H)`, a float bias and a bool mask
broadcastable to `(B, N, T, S)` (or None), scale a float, and an output `(B, T, N, H)`,

and is chosen by name in one place, `ModelConfig.attention_implementation`:

    "reference"  einsums written here; the only one with attention dropout and
                 the only one that can return the weights.
    "xla"        jax.nn.dot_product_attention(implementation="xla").
    "cudnn"      jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's
                 fused kernel, NVIDIA GPU with bfloat16 or float16 only.
    "auto"       the fastest valid one for the backend, dtype, shapes and dropout
                 (`choose_implementation` says which and why).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.argument_checks import fraction, shown, value_kind
from transformer_jax.dropout import dropout
from transformer_jax.masks import causal_mask, combine_masks

AttentionFn = Callable[..., jax.Array]

_IMPLEMENTATIONS: dict[str, AttentionFn] = {}
_HALF_DTYPES = (jnp.bfloat16, jnp.float16)


def register_attention(name: str):
    """Decorator adding an implementation with the signature above under `name`, or
    replacing one registered so before (a notebook cell run again). The names defined here
    ("reference", "xla", "cudnn") and "auto" are refused: a config naming one always gets
    this module's."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"an attention implementation's name must be a non-empty str, "
                        f"got {name!r}")
    if name == "auto" or getattr(_IMPLEMENTATIONS.get(name), "__module__", None) == __name__:
        raise ValueError(f"attention implementation {name!r} is built in; choose another "
                         f"name (registered: {', '.join(attention_implementations())})")

    def add(fn: AttentionFn) -> AttentionFn:
        if not callable(fn):
            raise TypeError(f"register_attention({name!r}) decorates a function, got "
                            f"{type(fn).__name__}")
        _IMPLEMENTATIONS[name] = fn
        return fn

    return add


def attention_implementations() -> tuple[str, ...]:
    """Every registered name, plus "auto"."""
    return (*_IMPLEMENTATIONS, "auto")


def attention_weights(query, key, bias=None, mask=None, *, scale=None, is_causal=False):
    """softmax(Q Kᵀ / √d_k), per head: the weights of §3.2.1, float32 `(B, N, T, S)`.

    `query` is `(B, T, N, H)`, `key` `(B, S, N, H)` (or both without B, as in jax.nn:
    then `(N, T, S)`); `bias` (float) and `mask` (bool)
    broadcast to `(B, N, T, S)`, and `scale` and `is_causal` mean what they mean in
    `dot_product_attention` (jax.nn's). Logits and softmax are float32 even for bfloat16
    inputs; the bias is added after scaling, as jax.nn does. Masked logits get
    float32's most negative finite value (the paper's −∞ without the NaN): a fully
    masked row becomes uniform instead of NaN.
    """
    query_BTNH, key_BSNH, _, bias_BNTS, mask_B1TS, batched = _inputs(query, key, key, bias,
                                                                      mask)
    scale, is_causal = _options(scale, is_causal)
    if is_causal:
        _check_causal(query_BTNH.shape[1], key_BSNH.shape[1])
        mask_B1TS = combine_masks(mask_B1TS, causal_mask(query_BTNH.shape[1]))
    weights_BNTS = _weights(query_BTNH, key_BSNH, bias_BNTS, mask_B1TS, scale)
    return weights_BNTS if batched else weights_BNTS[0]


def _options(scale, is_causal) -> tuple:
    """`scale` (None, or a number: an array of one, traced or not, too) and `is_causal` (a
    bool) as given, or a TypeError: text was read as its number and "no" as True."""
    if scale is not None and (value_kind(scale) not in "iuf" or np.ndim(scale) != 0):
        raise TypeError(f"scale must be a number or None, got {shown(scale)}")
    if (value_kind(is_causal) != "b" or np.ndim(is_causal) != 0
            or isinstance(is_causal, jax.core.Tracer)):
        raise TypeError(f"is_causal must be True or False, got {shown(is_causal)}")
    return scale, bool(is_causal)


def _check_causal(t: int, s: int) -> None:
    if t != s:
        raise ValueError(f"is_causal needs as many queries as keys, got T={t}, S={s}")


def _weights(query_BTNH, key_BSNH, bias_BNTS, mask_B1TS, scale):
    """`attention_weights` of inputs already checked."""
    logits_BNTS = jnp.einsum(
        "BTNH,BSNH->BNTS", query_BTNH, key_BSNH, preferred_element_type=jnp.float32
    )
    logits_BNTS = logits_BNTS * jnp.float32(_scale(scale, query_BTNH.shape[-1]))
    if bias_BNTS is not None:
        logits_BNTS = logits_BNTS + bias_BNTS.astype(jnp.float32)
    if mask_B1TS is not None:
        logits_BNTS = jnp.where(mask_B1TS, logits_BNTS, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(logits_BNTS, axis=-1)


def _scale(scale, head_dim: int) -> float:
    """The logits' factor: `scale`, or the paper's 1/√d_k when it is None."""
    return head_dim**-0.5 if scale is None else scale


@register_attention("reference")
def reference_attention(query, key, value, bias=None, mask=None, *, scale=None,
                        is_causal=False, dropout_rate=0.0, dropout_rng=None):
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V (eq. 1), written as two einsums."""
    return _reference_with_weights(query, key, value, bias, mask, scale, is_causal,
                                   dropout_rate, dropout_rng)[0]


def _reference_with_weights(query_BTNH, key_BSNH, value_BSNH, bias_BNTS, mask_B1TS, scale,
                            is_causal, dropout_rate, dropout_rng):
    if is_causal:
        mask_B1TS = combine_masks(mask_B1TS, causal_mask(query_BTNH.shape[1]))
    weights_BNTS = _weights(query_BTNH, key_BSNH, bias_BNTS, mask_B1TS, scale)
    probs_BNTS = weights_BNTS
    if dropout_rate > 0.0:
        # Not in the paper: attention dropout comes from tensor2tensor.
        probs_BNTS = dropout(probs_BNTS, dropout_rate, dropout_rng)
    out_BTNH = jnp.einsum("BNTS,BSNH->BTNH", probs_BNTS.astype(value_BSNH.dtype), value_BSNH)
    return out_BTNH, weights_BNTS


@register_attention("xla")
def xla_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                  dropout_rate=0.0, dropout_rng=None):
    """jax.nn.dot_product_attention with XLA's own lowering.

    Differentiated in bfloat16 or float16 under `jax_numpy_dtype_promotion="strict"`, it
    does not compile (jax 0.10 and 0.11): its backward pass holds a dot of a float32
    cotangent and a half-precision operand, which JAX lowers under the promotion in force
    when the whole program lowers, not the one below. "reference" has no such dot.
    """
    _refuse_dropout("xla", dropout_rate)
    if reason := xla_unsupported(query.dtype):
        raise ValueError(f"attention implementation 'xla' {reason}; use 'auto' or 'reference'")
    # jax.nn promotes bfloat16 logits with float32 itself, which strict promotion refuses.
    with jax.numpy_dtype_promotion("standard"):
        return jax.nn.dot_product_attention(query, key, value, bias, mask, scale=scale,
                                            is_causal=is_causal, implementation="xla")


@register_attention("cudnn")
def cudnn_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                    dropout_rate=0.0, dropout_rng=None):
    """cuDNN's fused (flash) attention through jax.nn.dot_product_attention.

    Causality goes to cuDNN as its causal mask type, which skips the blocks above
    the diagonal. Any other mask reaches it as an additive bias `(B, 1, T, S)`:
    padding and packed-segment masks. On an H100 (BENCHMARKS.md) the bias cost
    1.16-1.26x the unmasked kernel; cuDNN's packed layout (segment offsets, a
    private JAX API) was 3.6x slower and gave NaN gradients with jax 0.11.2 and
    cuDNN 9.19.
    """
    _refuse_dropout("cudnn", dropout_rate)
    query_BTNH, key_BSNH, value_BSNH, mask_B1TS = query, key, value, mask
    # Lengths are left to JAX: odd ones with a mask fail only when differentiated.
    reason = cudnn_unsupported(query_BTNH.dtype, head_dim=query_BTNH.shape[-1])
    if reason:
        raise ValueError(f"attention implementation 'cudnn' {reason}; use 'auto' or 'xla'")
    mask_BNTS = None
    if mask_B1TS is not None:  # cuDNN takes the mask as a bias with full T and S axes
        (b, t, _, _), s = query_BTNH.shape, key_BSNH.shape[1]
        if is_causal:  # so that rows the causal mask empties are found too
            mask_B1TS = combine_masks(mask_B1TS, causal_mask(t))
        query_BTNH, mask_BNTS = open_empty_rows(
            query_BTNH, jnp.broadcast_to(mask_B1TS, (b, mask_B1TS.shape[1], t, s)))
    return jax.nn.dot_product_attention(query_BTNH, key_BSNH, value_BSNH, bias, mask_BNTS,
                                        scale=scale, is_causal=is_causal,
                                        implementation="cudnn")


def open_empty_rows(query, mask):
    """(query, mask) with every query row that sees no key turned into one that sees all
    keys with a zero query: uniform weights, as the reference gives such a row (its
    logits are all equally low), and zero gradients into Q and K from it, as there.
    `query` is `(B, T, N, H)`, `mask` bool `(B, N, T, S)` (N may be 1).

    cuDNN 9.19 on an H100 returned NaN query gradients for such rows at T = S = 64
    (the padding queries of packed rows), and NaN times a zero cotangent still
    poisons the weight gradients. With cuDNN's causal mask type an opened row t
    still sees only keys 0..t: it gives their mean, not the mean of all values.
    """
    query_BTNH, mask_BNTS = query, mask
    empty_BNT1 = ~mask_BNTS.any(axis=-1, keepdims=True)
    empty_BTN1 = jnp.transpose(empty_BNT1, (0, 2, 1, 3))
    return jnp.where(empty_BTN1, 0, query_BTNH).astype(query_BTNH.dtype), mask_BNTS | empty_BNT1


def _refuse_dropout(name: str, dropout_rate: float) -> None:
    if dropout_rate > 0.0:
        raise ValueError(
            f"attention implementation {name!r} has no attention dropout "
            f"(got dropout_rate={dropout_rate}); use 'reference' or 'auto'"
        )


def cudnn_unsupported(dtype, *, head_dim=None, query_len=None, key_len=None, masked=False,
                      backend=None, compute_capability=None) -> str:
    """Why cuDNN attention cannot take this case, or "" when it can.

    cuDNN's rules as jax.nn.dot_product_attention applies them: an NVIDIA GPU,
    bfloat16 or float16, a head dim that is a multiple of 8 and at most 128 (256
    from Hopper, compute capability 9.0, on), and even lengths when a mask (a
    bias to cuDNN) is given: its backward pass refuses odd ones. Shapes left None
    are not checked; `backend` and `compute_capability` default to this machine's.
    """
    backend = backend or jax.default_backend()
    if backend not in ("gpu", "cuda"):
        return f"needs an NVIDIA GPU, but the JAX backend is {backend!r}"
    if jnp.dtype(dtype) not in _HALF_DTYPES:
        return f"needs bfloat16 or float16 inputs, got {jnp.dtype(dtype).name}"
    if head_dim is not None:
        capability = compute_capability or _compute_capability()
        largest = 256 if capability >= (9, 0) else 128
        if head_dim % 8 or head_dim > largest:
            return f"needs a head dim that is a multiple of 8 and at most {largest}, got {head_dim}"
    odd = [f"{n}={v}" for n, v in (("T", query_len), ("S", key_len)) if v is not None and v % 2]
    if masked and odd:
        return f"needs even lengths with a mask, got {', '.join(odd)}"
    return ""


def xla_unsupported(dtype, *, backend=None) -> str:
    """Why XLA's attention (jax.nn's) cannot take this dtype here, or "" when it can: its
    float16 logits are a float16 matmul with float32 results, which XLA's CPU backend does
    not compile (jax 0.10; eager calls run, jitted ones fail). `backend` defaults to this
    machine's."""
    if (backend or jax.default_backend()) == "cpu" and jnp.dtype(dtype) == jnp.float16:
        return "cannot run float16 on a CPU (XLA's CPU backend has no float16 matmul with " \
               "float32 results, which jax.nn's attention asks for)"
    return ""


def _compute_capability() -> tuple[int, ...]:
    version = getattr(jax.devices()[0], "compute_capability", "0.0")
    return tuple(int(x) for x in str(version).split("."))


def choose_implementation(name: str | None, dtype=jnp.float32, dropout_rate: float = 0.0, *,
                          head_dim=None, query_len=None, key_len=None,
                          masked=False) -> tuple[str, str]:
    """(the registered implementation `name` stands for, why), "auto" resolved.

    "auto" takes cuDNN's fused kernel wherever it can run (on an H100 it was 1.7x
    faster than XLA's on the base model's packed rows, BENCHMARKS.md); otherwise
    XLA's, or "reference" when there is attention dropout, which only it implements,
    or where XLA's cannot run (float16 on a CPU: `xla_unsupported`). None is "auto", as
    jax.nn's None.
    """
    name = "auto" if name is None else name
    if name != "auto":
        if name not in _IMPLEMENTATIONS:
            raise ValueError(
                f"unknown attention implementation {name!r}; "
                f"choose one of {', '.join(attention_implementations())}"
            )
        return name, "chosen by name"
    if dropout_rate > 0.0:
        return "reference", "attention dropout: only 'reference' implements it"
    reason = cudnn_unsupported(dtype, head_dim=head_dim, query_len=query_len, key_len=key_len,
                               masked=masked)
    if reason and (xla_reason := xla_unsupported(dtype)):
        return "reference", f"cuDNN {reason}, and XLA's attention {xla_reason}"
    if reason:
        return "xla", f"cuDNN {reason}"
    return "cudnn", "cuDNN's fused kernel"


def resolve_implementation(name: str | None, dtype=jnp.float32, dropout_rate: float = 0.0,
                           **shape) -> str:
    """The registered implementation that `name` stands for ("auto" resolved); `shape`
    takes `choose_implementation`'s head_dim, query_len, key_len and masked."""
    return choose_implementation(name, dtype, dropout_rate, **shape)[0]


def available_implementations(dtype=jnp.float32) -> tuple[str, ...]:
    """Registered implementations that can run on this backend with `dtype`."""
    unsupported = {"cudnn": cudnn_unsupported, "xla": xla_unsupported}
    return tuple(n for n in _IMPLEMENTATIONS if n not in unsupported or not unsupported[n](dtype))


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    implementation: str | None = "reference",
    dropout_rate: float = 0.0,
    dropout_rng=None,
    return_weights: bool = False,
):
    """Scaled dot-product attention (§3.2.1, eq. 1) on per-head inputs.

        Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

    query, key, value, bias, mask, scale and is_causal are
    jax.nn.dot_product_attention's, in its order and with its meanings, so a
    call with those is a call of the other. Not taken: its sequence lengths and
    local window (a mask does what they do) and keys with fewer heads than the
    queries (grouped-query attention is not the paper's). `implementation`'s names
    and default differ ("reference", the einsums of the equation; jax.nn's None, taken
    too, is our "auto"), and the dropout and weights arguments are this function's own.

    Args:
      query: `(B, T, N, H)`, or `(T, N, H)` (unbatched, as in jax.nn: then key and
        value, the output and the weights have no B either).
      key, value: `(B, S, N, H)`.
      bias: float, broadcastable to `(B, N, T, S)` (of rank 4 or less, as NumPy
        broadcasts), added to the scaled logits (not in the paper; None: none).
      mask: bool, broadcastable to `(B, N, T, S)` (the model's are `(B, 1, T, S)`; a
        `(T, S)` one serves every row and head), True where attention is allowed (see
        `transformer_jax.masks`).
      scale: the logits' factor (None: the paper's 1/√d_k).
      is_causal: also hide from query t every key after t (§3.2.3), as
        `combine_masks(mask, causal_mask(T))` would; needs T == S. cuDNN then
        skips the hidden blocks instead of reading them from a bias.
      implementation: a name from `attention_implementations()`, or None ("auto").
      dropout_rate: dropout on the attention weights (not in the paper).
      dropout_rng: PRNG key, needed when dropout_rate > 0.
      return_weights: also return the weights `(B, N, T, S)` (for notebooks);
        only the "reference" implementation can. They are softmax's, before attention
        dropout: the map the model attends with, where the output averages over what
        dropout keeps of it (rescaled by 1 / (1 - dropout_rate)).

    Returns:
      `(B, T, N, H)` in value's dtype, or `(output, weights)`.
    """
    query_BTNH, key_BSNH, value_BSNH, bias_BNTS, mask_B1TS, batched = _inputs(
        query, key, value, bias, mask)
    (_, t, _, h), s = query_BTNH.shape, key_BSNH.shape[1]
    scale, is_causal = _options(scale, is_causal)
    if is_causal:
        _check_causal(t, s)
    dropout_rate = fraction("dropout_rate", dropout_rate)
    if dropout_rate > 0.0 and dropout_rng is None:
        raise ValueError("dropout_rate > 0 needs a dropout_rng")
    name = resolve_implementation(implementation, query_BTNH.dtype, dropout_rate,
                                  head_dim=h, query_len=t, key_len=s,
                                  masked=mask_B1TS is not None or is_causal)
    if return_weights:
        if implementation not in (None, "reference", "auto"):
            raise ValueError(f"only 'reference' returns weights, not {implementation!r}")
        out_BTNH, weights_BNTS = _reference_with_weights(
            query_BTNH, key_BSNH, value_BSNH, bias_BNTS, mask_B1TS, scale, is_causal,
            dropout_rate, dropout_rng)
        return (out_BTNH, weights_BNTS) if batched else (out_BTNH[0], weights_BNTS[0])
    fn = _IMPLEMENTATIONS[name]
    out_BTNH = fn(query_BTNH, key_BSNH, value_BSNH, bias_BNTS, mask_B1TS, scale=scale,
                  is_causal=is_causal, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    return out_BTNH if batched else out_BTNH[0]


def _inputs(query, key, value, bias, mask):
    """The arguments as arrays of rank 4, checked (`_check_inputs`), and whether they were
    batched: jax.nn's unbatched `(T, N, H)` inputs are its `(1, T, N, H)` ones."""
    query_BTNH, key_BSNH, value_BSNH = map(jnp.asarray, (query, key, value))
    batched = not query_BTNH.ndim == key_BSNH.ndim == value_BSNH.ndim == 3
    if not batched:
        query_BTNH, key_BSNH, value_BSNH = query_BTNH[None], key_BSNH[None], value_BSNH[None]
    bias, mask = (x if x is None else jnp.asarray(x) for x in (bias, mask))
    bias_BNTS, mask_B1TS = _rank_4(bias), _rank_4(mask)
    _check_inputs(query_BTNH, key_BSNH, value_BSNH, bias_BNTS, mask_B1TS, batched,
                  given=tuple(x if x is None else x.shape for x in (bias, mask)))
    return query_BTNH, key_BSNH, value_BSNH, bias_BNTS, mask_B1TS, batched


def _check_inputs(query_BTNH, key_BSNH, value_BSNH, bias_BNTS, mask_B1TS, batched: bool,
                  given: tuple) -> None:
    """Clear errors for the shape and dtype mistakes that otherwise surface deep in XLA,
    or not at all, naming the shapes of bias and mask as `given`."""
    q, k, v = query_BTNH.shape, key_BSNH.shape, value_BSNH.shape
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        raise ValueError(
            "query, key and value must be (B, T, N, H), (B, S, N, H), (B, S, N, H), or "
            f"all three without B; got shapes {q}, {k}, {v}"
        )
    if k != v:
        raise ValueError(f"key {k} and value {v} must have one shape")
    dtypes = [x.dtype for x in (query_BTNH, key_BSNH, value_BSNH)]
    if not all(jnp.issubdtype(dtype, jnp.floating) for dtype in dtypes):
        # jax.nn.dot_product_attention takes integers and returns a meaningless int array.
        raise TypeError(f"query, key and value must be floating point, got "
                        f"{', '.join(map(str, dtypes))}")
    if len(set(dtypes)) > 1:  # jax.nn's rule: "reference" alone would promote them
        raise TypeError(f"query, key and value must have one dtype, got "
                        f"{', '.join(map(str, dtypes))}")
    b, t, n, h = q
    if (k[0], k[2], k[3]) != (b, n, h):
        raise ValueError(f"query {q} and key {k} differ in B, N or H")
    full_shape = (b, n, t, k[1])
    target = f"(B, N, T, S) = {full_shape}" if batched else f"(N, T, S) = {full_shape[1:]}"
    bias_shape, mask_shape = given
    if mask_B1TS is not None:
        m = mask_B1TS
        if m.dtype != jnp.bool_ or m.ndim != 4 or not _broadcasts(m.shape, full_shape):
            raise ValueError(f"mask must be bool, broadcastable to {target}; got {m.dtype} "
                             f"{mask_shape}")
    if bias_BNTS is not None:
        bias = bias_BNTS
        if (not jnp.issubdtype(bias.dtype, jnp.floating) or bias.ndim != 4
                or not _broadcasts(bias.shape, full_shape)):
            raise ValueError(f"bias must be float, broadcastable to {target}; got "
                             f"{bias.dtype} {bias_shape} (a bool mask goes to mask=)")


def _rank_4(x):
    """A bias or mask as an array of rank 4, ones put in front of a lower rank as NumPy
    broadcasts (a `(T, S)` mask is the `(1, 1, T, S)` one, as in jax.nn); None stays None."""
    if x is None:
        return None
    x = jnp.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x


def _broadcasts(shape, target) -> bool:
    return all(m in (1, t) for m, t in zip(shape, target))
