"""Flax Linen layers (§3.1–§3.3). They hold parameters and call the pure functions."""

import functools
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.argument_checks import DEFAULT_BITS, positive_int
from transformer_jax.attention import dot_product_attention
from transformer_jax.dropout import dropout
from transformer_jax.layer_norm import LayerNorm
from transformer_jax.model_config import ModelConfig

# Glorot-uniform projections and zero biases, as in tensor2tensor (the paper names no init).
_kernel_init = nn.initializers.xavier_uniform()


class KeyValue(NamedTuple):
    """The keys and values of one attention layer, `(B, S, N, H)` each."""

    key_BSNH: jax.Array
    value_BSNH: jax.Array


class CachedKeyValue(NamedTuple):
    """Keys and values kept for decoding, head-major: `(B, N, C, H)` each.

    C is the source length for encoder-decoder attention (projected from the memory
    once) and the cache length for self-attention (written one position per step).
    Head-major is the layout attention's matmuls read (batch and head dimensions
    first): in the `(B, C, N, H)` of `KeyValue`, XLA copied every layer's whole cache
    into this layout at every step (22 % of a beam search's time on a CPU).
    """

    key_BNCH: jax.Array
    value_BNCH: jax.Array

    @classmethod
    def of(cls, kv: KeyValue) -> "CachedKeyValue":
        return cls(*(jnp.swapaxes(x_BSNH, 1, 2) for x_BSNH in kv))

    def as_key_value(self) -> KeyValue:
        """The same arrays as `(B, C, N, H)` views, which XLA reads without a copy."""
        return KeyValue(*(jnp.swapaxes(x_BNCH, 1, 2) for x_BNCH in self))


def _keys_and_values(inputs_q, inputs_k, inputs_v, inputs_kv):
    """The inputs of the keys and of the values, by Flax's rules (`MultiHeadAttention`)."""
    if inputs_kv is not None:
        if inputs_k is not None or inputs_v is not None:
            raise ValueError("give inputs_kv (keys and values of one input) or inputs_k and "
                             "inputs_v, not both")
        return inputs_kv, inputs_kv
    if inputs_k is None and inputs_v is not None:
        raise ValueError("inputs_v needs inputs_k (without both, inputs_q is attended: "
                         "self-attention)")
    inputs_k = inputs_q if inputs_k is None else inputs_k
    return inputs_k, inputs_k if inputs_v is None else inputs_v


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2).

        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

    with h = `num_heads` and d_k = d_v = d_model / h. The per-head projections
    are one kernel each, `(D, N, H)`; the output kernel is `(N, H, D)`.
    Parameter names and shapes match Flax's `nn.MultiHeadDotProductAttention`,
    so weights move between the two, and so do the call's arguments:
    `mha.apply(variables, x, memory, memory, mask=m)` (inputs_q, inputs_k, inputs_v).

    A full pass is `__call__`. Decoding calls the parts: `keys_values` (the projection of
    keys and values, which `__call__` uses too: the encoder's memory, once per search),
    `attend` (queries over keys and values already projected) and `extend` (self-attention
    of one step: its keys and values written into the cache, then attended).

    When the "intermediates" collection is mutable, the attention weights
    `(B, N, T, S)` are sown as "attention_weights" (computed by the reference
    implementation); otherwise nothing extra is computed.
    """

    num_heads: int
    d_model: int
    implementation: str = "auto"
    dropout_rate: float = 0.0  # on the attention weights; not in the paper
    dtype: jnp.dtype = jnp.float32
    use_bias: bool = True  # a deviation (below); False is the paper's

    def setup(self):
        positive_int("num_heads", self.num_heads)
        positive_int("d_model", self.d_model)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by "
                             f"num_heads={self.num_heads}")
        # With biases by default, a deviation: the paper's W^Q, W^K, W^V and W^O have none.
        # Flax's nn.MultiHeadDotProductAttention and torch.nn.Transformer have them, and the
        # weights move between them and this (4 D per attention: 36,864 of base's 63.1M
        # parameters). `use_bias=False` (ModelConfig.attention_bias) is the paper's.
        project = functools.partial(
            nn.DenseGeneral, features=(self.num_heads, self.head_dim), axis=-1,
            dtype=self.dtype, param_dtype=jnp.float32, kernel_init=_kernel_init,
            use_bias=self.use_bias,
        )
        self.query, self.key, self.value = project(), project(), project()
        self.out = nn.DenseGeneral(features=self.d_model, axis=(-2, -1), dtype=self.dtype,
                                   param_dtype=jnp.float32, kernel_init=_kernel_init,
                                   use_bias=self.use_bias)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None, mask=None,
                 is_causal: bool = False, deterministic: bool = True):
        """The queries of `inputs_q` `(B, T, D)` attend over the keys of `inputs_k` and the
        values of `inputs_v` `(B, S, D)` under `mask`, bool and broadcastable to
        `(B, 1, T, S)`. Returns `(B, T, D)`.

        As in Flax's layer, `inputs_k` is `inputs_q` when None (self-attention), `inputs_v`
        is `inputs_k` when None, and `inputs_kv` (Flax's older keyword) is both.
        `is_causal` hides later keys too (self-attention of a full decoder pass); see
        `dot_product_attention`.
        """
        inputs_k, inputs_v = _keys_and_values(inputs_q, inputs_k, inputs_v, inputs_kv)
        for name, x, length in (("inputs_q", inputs_q, "T"), ("inputs_k", inputs_k, "S"),
                                ("inputs_v", inputs_v, "S")):
            if jnp.ndim(x) != 3:  # else attention names per-head shapes the caller never gave
                raise ValueError(f"{name} must be (B, {length}, features), got shape "
                                 f"{jnp.shape(x)}; a single sequence is x[None]")
        if jnp.shape(inputs_k)[:2] != jnp.shape(inputs_v)[:2]:
            raise ValueError(f"inputs_k {jnp.shape(inputs_k)} and inputs_v "
                             f"{jnp.shape(inputs_v)} must have one (B, S)")
        return self.attend(inputs_q, self.keys_values(inputs_k, inputs_v), mask,
                           is_causal=is_causal, deterministic=deterministic)

    def keys_values(self, inputs_kv, inputs_v=None) -> KeyValue:
        """K W^K and V W^V of every head, `(B, S, N, H)` each, of `inputs_kv` `(B, S, D)`
        (the values of `inputs_v` when given)."""
        return KeyValue(self.key(inputs_kv),
                        self.value(inputs_kv if inputs_v is None else inputs_v))

    def attend(self, inputs_q, kv: KeyValue, mask=None, *, is_causal: bool = False,
               deterministic: bool = True):
        """MultiHead(Q, K, V) with the keys and values already projected: `(B, T, D)`.

        `inputs_q` is `(B, T, D)`; `mask` as in `__call__`.
        """
        q_BTNH, mask_B1TS = self.query(inputs_q), mask
        rate = 0.0 if deterministic else self.dropout_rate
        rng = self.make_rng("dropout") if rate > 0.0 else None
        if self.is_mutable_collection("intermediates"):
            out_BTNH, weights_BNTS = dot_product_attention(
                q_BTNH, *kv, mask=mask_B1TS, is_causal=is_causal, implementation="reference",
                dropout_rate=rate, dropout_rng=rng, return_weights=True,
            )
            self.sow("intermediates", "attention_weights", weights_BNTS)
        else:
            out_BTNH = dot_product_attention(
                q_BTNH, *kv, mask=mask_B1TS, is_causal=is_causal,
                implementation=self.implementation, dropout_rate=rate, dropout_rng=rng,
            )
        return self.out(out_BTNH)

    def cached_keys_values(self, inputs_kv) -> CachedKeyValue:
        """`keys_values` of `inputs_kv` `(B, S, D)`, head-major for decoding: `(B, N, S, H)`."""
        return CachedKeyValue.of(self.keys_values(inputs_kv))

    def empty_cache(self, batch_size: int, cache_length: int) -> CachedKeyValue:
        """A self-attention cache of C = `cache_length` empty positions, `(B, N, C, H)`."""
        empty_BNCH = jnp.zeros((batch_size, self.num_heads, cache_length, self.head_dim),
                               self.dtype)
        return CachedKeyValue(empty_BNCH, empty_BNCH)

    def extend(self, inputs_q, cache: CachedKeyValue, position, mask):
        """Self-attention of T new positions over the cache: (out `(B, T, D)`, new cache).

        The keys and values of `inputs_q` `(B, T, D)` are written into `cache` at
        `position` (a scalar, the same for every row), and its queries attend to the C
        cached positions under `mask` (broadcastable to `(B, 1, T, C)`), which must hide
        the slots not written yet.
        """
        start = (0, 0, position, 0)
        cache = CachedKeyValue(*(
            jax.lax.dynamic_update_slice(cached_BNCH, new_BNTH.astype(cached_BNCH.dtype), start)
            for cached_BNCH, new_BNTH in zip(cache, self.cached_keys_values(inputs_q))))
        return self.attend(inputs_q, cache.as_key_value(), mask), cache


class FeedForward(nn.Module):
    """Position-wise feed-forward network (§3.3, eq. 2): FFN(x) = max(0, x W1 + b1) W2 + b2."""

    d_ff: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, inputs):
        """FFN of every position of `inputs` `(B, T, D)`: `(B, T, D)`."""
        x_BTD = inputs
        dense = functools.partial(
            nn.Dense, dtype=self.dtype, param_dtype=jnp.float32, kernel_init=_kernel_init
        )
        h_BTF = nn.relu(dense(self.d_ff, name="wi")(x_BTD))
        return dense(x_BTD.shape[-1], name="wo")(h_BTF)


class Dropout(nn.Module):
    """`dropout.dropout` (§5.4) as a Flax module: its key from the "dropout" rng collection,
    as `flax.linen.Dropout`'s; `deterministic=True` (evaluation, decoding) returns `x`."""

    rate: float
    bits: int = DEFAULT_BITS

    @nn.compact
    def __call__(self, x, *, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"), bits=self.bits)


def residual(x, sublayer: Callable, norm: LayerNorm, dropout: Dropout, *,
             pre_layer_norm: bool, deterministic: bool):
    """One residual sublayer (§3.1, §5.4): LayerNorm(x + Dropout(Sublayer(x))).

    With pre_layer_norm (a deviation from the paper, used by most later models
    for stabler training): x + Dropout(Sublayer(LayerNorm(x))).
    """
    if pre_layer_norm:
        return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x, dropout(sublayer(x), deterministic=deterministic))  # LayerNorm(x + y)


class _Layer(nn.Module):
    """Shared constructors for the encoder and decoder layers."""

    config: ModelConfig

    def _attention(self) -> MultiHeadAttention:
        c = self.config
        return MultiHeadAttention(
            num_heads=c.num_heads, d_model=c.d_model, implementation=c.attention_implementation,
            dropout_rate=c.attention_dropout_rate, dtype=c.compute_dtype,
            use_bias=c.attention_bias,
        )

    def _norm(self) -> LayerNorm:
        c = self.config
        return LayerNorm(epsilon=c.layer_norm_epsilon, implementation=c.layer_norm_implementation)

    def _ffn(self) -> FeedForward:
        return FeedForward(self.config.d_ff, dtype=self.config.compute_dtype)

    def _residual(self, x, sublayer, norm, deterministic: bool):
        return residual(x, sublayer, norm, self.dropout,
                        pre_layer_norm=self.config.pre_layer_norm, deterministic=deterministic)


class EncoderLayer(_Layer):
    """Self-attention, then feed-forward, each a residual sublayer (§3.1).

    Called as Flax's WMT example calls its encoder block: `inputs` `(B, S, D)` and
    `encoder_mask`, broadcastable to `(B, 1, S, S)`.
    """

    def setup(self):
        self.self_attention, self.self_attention_norm = self._attention(), self._norm()
        self.ffn, self.ffn_norm = self._ffn(), self._norm()
        self.dropout = Dropout(self.config.dropout_rate, self.config.dropout_bits)

    def __call__(self, inputs, encoder_mask=None, *, deterministic: bool = True):
        def attend(x):
            return self.self_attention(x, mask=encoder_mask, deterministic=deterministic)

        x_BSD = self._residual(inputs, attend, self.self_attention_norm, deterministic)
        return self._residual(x_BSD, self.ffn, self.ffn_norm, deterministic)


class DecoderLayer(_Layer):
    """Masked self-attention, encoder-decoder attention, feed-forward (§3.1).

    `__call__` is the full (teacher-forced) pass, named as Flax's WMT example names its
    decoder block: `targets` `(B, T, D)` (the embedded decoder input), `encoded` `(B, S, D)`
    (the encoder's memory), `decoder_mask` `(B, 1, T, T)` and `encoder_decoder_mask`
    `(B, 1, T, S)`, each broadcastable. It makes its self-attention causal itself
    (`is_causal`, so cuDNN can skip the hidden blocks): `decoder_mask` holds only padding
    and segments. `step` decodes from cached keys and values.
    """

    def setup(self):
        self.self_attention, self.self_attention_norm = self._attention(), self._norm()
        self.cross_attention, self.cross_attention_norm = self._attention(), self._norm()
        self.ffn, self.ffn_norm = self._ffn(), self._norm()
        self.dropout = Dropout(self.config.dropout_rate, self.config.dropout_bits)

    def __call__(self, targets, encoded, decoder_mask=None, encoder_decoder_mask=None, *,
                 deterministic: bool = True):
        memory_BSD = encoded

        def attend_self(y):
            return self.self_attention(y, mask=decoder_mask, is_causal=True,
                                       deterministic=deterministic)

        def attend_memory(y):
            return self.cross_attention(y, memory_BSD, mask=encoder_decoder_mask,
                                        deterministic=deterministic)

        y_BTD = self._residual(targets, attend_self, self.self_attention_norm, deterministic)
        y_BTD = self._residual(y_BTD, attend_memory, self.cross_attention_norm, deterministic)
        return self._residual(y_BTD, self.ffn, self.ffn_norm, deterministic)

    def step(self, targets, self_kv: CachedKeyValue, cross_kv: CachedKeyValue, position,
             decoder_mask, encoder_decoder_mask, *, beams: int = 1):
        """The T new positions `targets` `(R, T, D)` from `position` on, over the cache:
        (y `(R, T, D)`, new `self_kv`).

        `self_kv` holds the C self-attention positions of each row (see
        `MultiHeadAttention.extend`), which `decoder_mask` `(R, 1, T, C)` must hide where
        not written yet; `cross_kv` the memory's keys and values `(B, N, S, H)`, projected
        once per sentence, under `encoder_decoder_mask` `(B, 1, 1, S)`. R = B · `beams`:
        rows b·K .. b·K + K-1 are example b's K beams, which read its memory together.
        """
        written = []

        def attend_self(y):
            out_RTD, new_kv = self.self_attention.extend(y, self_kv, position, decoder_mask)
            written.append(new_kv)
            return out_RTD

        def attend_memory(y_RTD):
            # An example's K beams are K·T queries of its one copy of the memory.
            rows, length, width = y_RTD.shape
            y_BQD = y_RTD.reshape(rows // beams, beams * length, width)
            out_BQD = self.cross_attention.attend(y_BQD, cross_kv.as_key_value(),
                                                  encoder_decoder_mask)
            return out_BQD.reshape(rows, length, width)

        y_RTD = self._residual(targets, attend_self, self.self_attention_norm, True)
        y_RTD = self._residual(y_RTD, attend_memory, self.cross_attention_norm, True)
        return self._residual(y_RTD, self.ffn, self.ffn_norm, True), written[0]
