"""Flax Linen layers (§3.1–§3.3). They hold parameters and call the pure functions."""

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.attention import dot_product_attention
from transformer_jax.model_config import ModelConfig

# Glorot-uniform projections and zero biases, as in tensor2tensor (the paper names no init).
_kernel_init = nn.initializers.xavier_uniform()


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2).

        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

    The per-head projections are one kernel each, `(D, N, H)`; the output
    kernel is `(N, H, D)`. Parameter names and shapes match Flax's
    `nn.MultiHeadDotProductAttention`, so weights move between the two.

    When the "intermediates" collection is mutable, the attention weights
    `(B, N, T, S)` are sown as "attention_weights" (computed by the reference
    implementation); otherwise nothing extra is computed.
    """

    num_heads: int
    implementation: str = "auto"
    dropout_rate: float = 0.0  # on the attention weights; not in the paper
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, inputs_q_BTD, inputs_kv_BSD, mask=None, *, is_causal: bool = False,
                 deterministic: bool = True, cache=None):
        """Attention of the queries over the keys/values; with `cache`, returns (out, cache).

        `is_causal` hides later keys too (self-attention of a full decoder pass); see
        `dot_product_attention`.

        A decoding cache is an explicit pytree, one of two kinds:
          self-attention  {"key", "value": (B, L, N, H), "index": (B,)}: this call's keys
                          and values are written at `index` (the same in every row), and
                          the queries attend to the L cached positions under `mask`.
          encoder-decoder {"key", "value": (B, S, N, H)}: the memory's projections,
                          computed once per sentence; `inputs_kv_BSD` is not read.
        """
        d_model = inputs_q_BTD.shape[-1]
        if d_model % self.num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={self.num_heads}")
        head_dim = d_model // self.num_heads
        project = functools.partial(
            nn.DenseGeneral, features=(self.num_heads, head_dim), axis=-1,
            dtype=self.dtype, param_dtype=jnp.float32, kernel_init=_kernel_init,
        )
        q_BTNH = project(name="query")(inputs_q_BTD)
        if cache is not None and "index" not in cache:
            k_BSNH, v_BSNH = cache["key"], cache["value"]
        else:
            k_BSNH = project(name="key")(inputs_kv_BSD)
            v_BSNH = project(name="value")(inputs_kv_BSD)
        if cache is not None and "index" in cache:
            start = (0, cache["index"][0], 0, 0)
            write = lambda cached, new: jax.lax.dynamic_update_slice(  # noqa: E731
                cached, new.astype(cached.dtype), start)
            k_BSNH, v_BSNH = write(cache["key"], k_BSNH), write(cache["value"], v_BSNH)
            cache = {"key": k_BSNH, "value": v_BSNH,
                     "index": cache["index"] + inputs_q_BTD.shape[1]}

        rate = 0.0 if deterministic else self.dropout_rate
        rng = self.make_rng("dropout") if rate > 0.0 else None
        if self.is_mutable_collection("intermediates"):
            out_BTNH, weights_BNTS = dot_product_attention(
                q_BTNH, k_BSNH, v_BSNH, mask, is_causal=is_causal, implementation="reference",
                dropout_rate=rate, dropout_rng=rng, return_weights=True,
            )
            self.sow("intermediates", "attention_weights", weights_BNTS)
        else:
            out_BTNH = dot_product_attention(
                q_BTNH, k_BSNH, v_BSNH, mask, is_causal=is_causal,
                implementation=self.implementation, dropout_rate=rate, dropout_rng=rng,
            )
        out_BTD = nn.DenseGeneral(
            features=d_model, axis=(-2, -1), dtype=self.dtype, param_dtype=jnp.float32,
            kernel_init=_kernel_init, name="out",
        )(out_BTNH)
        return out_BTD if cache is None else (out_BTD, cache)


class FeedForward(nn.Module):
    """Position-wise feed-forward network (§3.3, eq. 2): FFN(x) = max(0, x W1 + b1) W2 + b2."""

    d_ff: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BTD):
        dense = functools.partial(
            nn.Dense, dtype=self.dtype, param_dtype=jnp.float32, kernel_init=_kernel_init
        )
        h_BTF = nn.relu(dense(self.d_ff, name="wi")(x_BTD))
        return dense(x_BTD.shape[-1], name="wo")(h_BTF)


def residual(x, sublayer: Callable, norm: nn.LayerNorm, dropout: nn.Dropout, *,
             pre_layer_norm: bool, deterministic: bool):
    """One residual sublayer (§3.1, §5.4): LayerNorm(x + Dropout(Sublayer(x))).

    With pre_layer_norm (a deviation from the paper, used by most later models
    for stabler training): x + Dropout(Sublayer(LayerNorm(x))).
    """
    if pre_layer_norm:
        return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))


class _Layer(nn.Module):
    """Shared constructors for the encoder and decoder layers."""

    config: ModelConfig

    def _attention(self, name: str) -> MultiHeadAttention:
        c = self.config
        return MultiHeadAttention(
            num_heads=c.num_heads, implementation=c.attention_implementation,
            dropout_rate=c.attention_dropout_rate, dtype=c.compute_dtype, name=name,
        )

    def _residual(self, x, sublayer, name: str, deterministic: bool):
        c = self.config
        norm = nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=c.compute_dtype,
                            param_dtype=jnp.float32, name=f"{name}_norm")
        return residual(x, sublayer, norm, nn.Dropout(c.dropout_rate),
                        pre_layer_norm=c.pre_layer_norm, deterministic=deterministic)


class EncoderLayer(_Layer):
    """Self-attention, then feed-forward, each a residual sublayer (§3.1)."""

    @nn.compact
    def __call__(self, x_BSD, mask_B1SS=None, *, deterministic: bool = True):
        attend = self._attention("self_attention")
        x_BSD = self._residual(
            x_BSD, lambda y: attend(y, y, mask_B1SS, deterministic=deterministic),
            "self_attention", deterministic)
        ffn = FeedForward(self.config.d_ff, dtype=self.config.compute_dtype, name="ffn")
        return self._residual(x_BSD, ffn, "ffn", deterministic)


class DecoderLayer(_Layer):
    """Masked self-attention, encoder-decoder attention, feed-forward (§3.1).

    A full pass makes its self-attention causal itself (`is_causal`, so cuDNN can
    skip the hidden blocks): `self_mask_B1TT` holds only padding and segments.
    With `cache` ({"self": ..., "cross": ...}, see MultiHeadAttention) it decodes
    one step from cached keys and values and returns (y, new cache).
    """

    @nn.compact
    def __call__(self, y_BTD, memory_BSD, self_mask_B1TT=None, cross_mask_B1TS=None, *,
                 deterministic: bool = True, cache=None):
        new_cache = {}

        def attend(name, kv_BSD, mask):
            module = self._attention(name)
            kind = "self" if name == "self_attention" else "cross"

            def sublayer(y):
                if cache is None:
                    return module(y, y if kv_BSD is None else kv_BSD, mask,
                                  is_causal=kind == "self", deterministic=deterministic)
                out, new_cache[kind] = module(y, y if kv_BSD is None else kv_BSD, mask,
                                              deterministic=deterministic, cache=cache[kind])
                return out

            return sublayer

        y_BTD = self._residual(y_BTD, attend("self_attention", None, self_mask_B1TT),
                               "self_attention", deterministic)
        y_BTD = self._residual(y_BTD, attend("cross_attention", memory_BSD, cross_mask_B1TS),
                               "cross_attention", deterministic)
        ffn = FeedForward(self.config.d_ff, dtype=self.config.compute_dtype, name="ffn")
        y_BTD = self._residual(y_BTD, ffn, "ffn", deterministic)
        return y_BTD if cache is None else (y_BTD, new_cache)
