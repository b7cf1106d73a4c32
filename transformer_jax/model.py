"""The encoder-decoder Transformer (§3, Figure 1) as Flax Linen modules.

Token id 0 is padding. `Transformer(config).apply(variables, inputs, targets)`, on
token ids `(B, S)` and `(B, T)`, returns float32 logits `(B, T, V)` for every target
position, with the decoder reading the targets shifted right by one. Arguments take
the names of Flax's WMT example (`inputs`, `targets`, `encoded`, `inputs_positions`,
`inputs_segmentation`, ...); the dimension key names the tensors inside.
"""

from collections.abc import Mapping
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.argument_checks import positive_int, shown
from transformer_jax.decoding import PerExample
from transformer_jax.layer_norm import LayerNorm
from transformer_jax.layers import CachedKeyValue, DecoderLayer, Dropout, EncoderLayer
from transformer_jax.masks import combine_masks, padding_mask, segment_mask
from transformer_jax.model_config import ModelConfig
from transformer_jax.output_loss import output_loss
from transformer_jax.positional import sinusoidal_encoding
from transformer_jax.token_ids import DECODER_START_ID, PAD_ID, check_ids
from transformer_jax.train_state import abstract_params


def shift_right(x, segment_ids=None):
    """The decoder input: targets `x` `(B, T)` moved one step right, `DECODER_START_ID` (0)
    at the start of each sequence (the arguments of Flax's `shift_inputs`). §3.1: "the
    output embeddings are offset by one position", so position t reads targets before t.

    With packed rows (`segment_ids` `(B, T)`) the shift restarts in every segment, so no
    example sees the previous example's last token:

        x            [[5, 6, 7, 8, 9, 0]]      segment_ids [[1, 1, 1, 2, 2, 0]]
        shifted      [[0, 5, 6, 0, 8, 0]]
    """
    targets_BT = jnp.asarray(x)
    if targets_BT.ndim != 2:
        raise ValueError(f"x must be (B, T) targets, got shape {targets_BT.shape}; a single "
                         f"sequence is x[None]")
    _check_shaped_as(targets_BT, "x", segment_ids=segment_ids)
    shifted_BT = jnp.pad(targets_BT, ((0, 0), (1, 0)), constant_values=DECODER_START_ID)[:, :-1]
    if segment_ids is not None:
        segments_BT = jnp.asarray(segment_ids)
        same_segment_BT = segments_BT == jnp.pad(segments_BT, ((0, 0), (1, 0)))[:, :-1]
        shifted_BT = jnp.where(same_segment_BT, shifted_BT, DECODER_START_ID)
    return shifted_BT


class Embedder(nn.Module):
    """The one embedding matrix shared by source, target and output (§3.4): `encode` looks
    tokens up and multiplies by √d_model; `decode` is the pre-softmax linear layer, the
    same matrix transposed."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.table = nn.Embed(
            c.vocab_size, c.d_model, dtype=c.compute_dtype, param_dtype=jnp.float32,
            # With the ×√D below, embeddings start with unit variance (as in tensor2tensor).
            embedding_init=nn.initializers.normal(stddev=c.d_model**-0.5),
        )

    def encode(self, inputs):
        """Token embeddings multiplied by √d_model (§3.4): token ids `inputs` `(B, T)` to
        `(B, T, D)`.

        The rows are gathered from the float32 table and then cast to the compute
        dtype (nn.Embed casts the whole table first): the gradient is then a float32
        scatter-add instead of a bfloat16 one. With the loss's masked sum (losses.py),
        this took the base step's scatters on an H100 from 18 to 0.2 ms (BENCHMARKS.md).
        """
        c = self.config
        # Known ids (a notebook's eager model.apply) outside [0, V) would gather rows of NaN
        # (jnp.take fills rows out of range): refused, as floats and unbatched ids are.
        check_ids(inputs, "token ids", c.vocab_size, batched=True)
        rows_BTD = jnp.take(self.table.embedding, inputs, axis=0)
        return rows_BTD.astype(c.compute_dtype) * jnp.sqrt(c.d_model).astype(c.compute_dtype)

    def decode(self, query):
        """The tied pre-softmax linear transform (§3.4): float32 logits `(B, T, V)` of the
        decoder's output `query` `(B, T, D)` (the name of Flax's `nn.Embed.attend`)."""
        return self.table.attend(query).astype(jnp.float32)

    def loss(self, query, targets, *, label_smoothing: float, chunk_size: int):
        """`output_loss` of `decode(query)`'s logits for `targets` `(B, T)`, `chunk_size`
        target tokens at a time: (Σ loss, Σ weight, Σ correct), no `(B, T, V)` logits."""
        return output_loss(query, self.table.embedding, targets,
                           label_smoothing=label_smoothing, chunk_size=chunk_size,
                           dtype=self.config.compute_dtype)


class AddPositions(nn.Module):
    """Adds position information to embeddings (§3.5), then dropout (§5.4)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, inputs, inputs_positions=None, *, deterministic: bool = True):
        """`inputs` `(B, T, D)` plus the encoding of `inputs_positions` `(B, T)` (0, 1, ...
        when None; packed rows restart at 0 in each segment), then dropout."""
        c = self.config
        x_BTD, positions_BT = inputs, inputs_positions
        if positions_BT is None:
            positions_BT = jnp.arange(x_BTD.shape[1])[None]
        if c.positional_encoding == "sinusoidal":
            x_BTD = x_BTD + sinusoidal_encoding(positions_BT, c.d_model).astype(x_BTD.dtype)
        elif c.positional_encoding == "learned":  # the alternative of Table 3, row (E)
            if x_BTD.shape[1] > c.max_length:
                raise ValueError(f"sequence length {x_BTD.shape[1]} exceeds the learned "
                                 f"position table (ModelConfig.max_length={c.max_length})")
            if inputs_positions is not None:  # past the table, jnp.take gives NaN rows
                check_ids(positions_BT, "positions", c.max_length,
                          bound="ModelConfig.max_length, the learned table's rows")
            table_PD = self.param("table", nn.initializers.normal(stddev=0.02),
                                  (c.max_length, c.d_model), jnp.float32)
            x_BTD = x_BTD + jnp.take(table_PD, positions_BT, axis=0).astype(x_BTD.dtype)
        return Dropout(c.dropout_rate, c.dropout_bits)(x_BTD, deterministic=deterministic)


class Encoder(nn.Module):
    """N identical layers of self-attention and feed-forward (§3.1)."""

    config: ModelConfig
    embedder: Embedder

    @nn.compact
    def __call__(self, inputs, inputs_positions=None, inputs_segmentation=None, *,
                 deterministic: bool = True):
        """The memory `(B, S, D)` of token ids `inputs` `(B, S)`; packed rows pass
        `inputs_positions` and `inputs_segmentation` `(B, S)` (see `Transformer`)."""
        c = self.config
        inputs_BS, positions_BS, segments_BS = inputs, inputs_positions, inputs_segmentation
        embedded_BSD = self.embedder.encode(inputs_BS)  # checks the ids
        _check_shaped_as(inputs_BS, "inputs", inputs_positions=positions_BS,
                         inputs_segmentation=segments_BS)
        x_BSD = AddPositions(c, name="positions")(
            embedded_BSD, positions_BS, deterministic=deterministic)
        mask_B1SS = combine_masks(
            padding_mask(inputs_BS),
            None if segments_BS is None else segment_mask(segments_BS),
        )
        for i in range(c.num_layers):
            x_BSD = EncoderLayer(c, name=f"layer_{i}")(x_BSD, mask_B1SS,
                                                       deterministic=deterministic)
        if c.pre_layer_norm:  # pre-LN leaves the residual stream unnormalised
            x_BSD = _final_norm(c)(x_BSD)
        return x_BSD


class DecodingCache(NamedTuple):
    """What a decoding step reads and updates, every leaf batch-first (so a beam
    search can repeat and reorder rows).

    `position_R` is the position the next token takes, the same in every row; `self_kv`
    holds, per layer, the self-attention keys and values of positions 0..position-1 in
    C slots `(R, N, C, H)`; `cross_kv` the encoder-decoder keys and values `(B, N, S, H)`,
    projected from the memory once, and `cross_mask_B11S` the source's padding. Keys and
    values are head-major (`CachedKeyValue`), as attention reads them. R counts the
    search's rows: B, or B·K in beam search, which leaves the source's parts
    (`PerExample`) at one copy per example: its K beams read it together.
    """

    position_R: jax.Array
    self_kv: tuple[CachedKeyValue, ...]
    cross_kv: PerExample  # tuple[CachedKeyValue, ...]
    cross_mask_B11S: PerExample  # jax.Array

    @property
    def cache_length(self) -> int:
        """C: the tokens it holds. The searches refuse a longer `max_length`: past C, each
        step would overwrite the last slot (`dynamic_update_slice` clamps its start)."""
        return self.self_kv[0].key_BNCH.shape[2]


class Decoder(nn.Module):
    """N layers of masked self-attention, encoder-decoder attention, feed-forward (§3.1).

    `__call__` is the teacher-forced pass over whole targets; `init_cache` and `step`
    decode one token at a time.
    """

    config: ModelConfig
    embedder: Embedder

    def setup(self):
        c = self.config
        self.positions = AddPositions(c)
        self.layers = [DecoderLayer(c, name=f"layer_{i}") for i in range(c.num_layers)]
        if c.pre_layer_norm:  # pre-LN leaves the residual stream unnormalised
            self.final_norm = _final_norm(c)

    def __call__(self, encoded, inputs, targets, targets_positions=None, **kwargs):
        """Logits `(B, T, V)` for every position of `targets` `(B, T)`, the decoder reading
        them shifted right, over the memory `encoded` `(B, S, D)` of `inputs` `(B, S)`."""
        return self.embedder.decode(self.features(encoded, inputs, targets, targets_positions,
                                                  **kwargs))

    def features(self, encoded, inputs, targets, targets_positions=None, *,
                 inputs_segmentation=None, targets_segmentation=None,
                 deterministic: bool = True):
        """What the tied output layer reads, `(B, T, D)`: the last layer's output (pre-LN:
        after the final norm)."""
        memory_BSD = encoded
        check_ids(targets, "targets", self.config.vocab_size, batched=True)
        _check_shaped_as(targets, "targets", targets_positions=targets_positions,
                         targets_segmentation=targets_segmentation)
        if not (jnp.shape(inputs)[0] == targets.shape[0] == jnp.shape(encoded)[0]
                and jnp.shape(encoded)[1:] == (*jnp.shape(inputs)[1:2], self.config.d_model)):
            raise ValueError(f"the memory {jnp.shape(encoded)}, inputs {jnp.shape(inputs)} and "
                             f"targets {targets.shape} must be (B, S, D), (B, S) and (B, T) "
                             f"with D = d_model = {self.config.d_model}: row b of each is one "
                             f"example")
        decoder_inputs_BT, self_mask_B1TT, cross_mask_B1TS = self._masks(
            inputs, targets, inputs_segmentation, targets_segmentation)
        y_BTD = self.positions(self.embedder.encode(decoder_inputs_BT), targets_positions,
                               deterministic=deterministic)
        for layer in self.layers:
            y_BTD = layer(y_BTD, memory_BSD, self_mask_B1TT, cross_mask_B1TS,
                          deterministic=deterministic)
        return self._final(y_BTD)

    def init_cache(self, encoded, inputs, max_length: int) -> DecodingCache:
        """An empty cache of C = `max_length` positions, with the keys and values of the
        memory `encoded` `(B, S, D)` and the padding of its token ids `inputs` `(B, S)`."""
        c = self.config
        max_length = positive_int("max_length", max_length)  # 0: a cache with no slot
        if c.positional_encoding == "learned" and max_length > c.max_length:
            # Inside a search's loop, a position past the table would give NaN logits.
            raise ValueError(f"max_length={max_length} exceeds the learned position table "
                             f"(ModelConfig.max_length={c.max_length})")
        batch_size = encoded.shape[0]
        memory_BSD = encoded.astype(self.config.compute_dtype)
        return DecodingCache(
            position_R=jnp.zeros((batch_size,), jnp.int32),
            self_kv=tuple(layer.self_attention.empty_cache(batch_size, max_length)
                          for layer in self.layers),
            cross_kv=PerExample(tuple(layer.cross_attention.cached_keys_values(memory_BSD)
                                      for layer in self.layers)),
            cross_mask_B11S=PerExample(padding_mask(inputs)),
        )

    def step(self, ids, cache: DecodingCache):
        """One decoding step: the logits `(R, 1, V)` after `ids` `(R, 1)` (the previous
        tokens, already shifted: `DECODER_START_ID` first), and the cache one position on.
        R is B·K when `cache` holds K beams of each of B examples (`DecodingCache`)."""
        position, cache_length = cache.position_R[0], cache.cache_length
        beams = ids.shape[0] // cache.cross_mask_B11S.value.shape[0]  # K: rows per example
        y_R1D = self.positions(self.embedder.encode(ids), cache.position_R[:, None])
        # Slots 0..position are written; later ones are still empty.
        self_mask_R11C = (jnp.arange(cache_length) <= position)[None, None, None, :]
        written = []
        for layer, self_kv, cross_kv in zip(self.layers, cache.self_kv, cache.cross_kv.value):
            y_R1D, self_kv = layer.step(y_R1D, self_kv, cross_kv, position, self_mask_R11C,
                                        cache.cross_mask_B11S.value, beams=beams)
            written.append(self_kv)
        logits_R1V = self.embedder.decode(self._final(y_R1D))
        return logits_R1V, cache._replace(position_R=cache.position_R + 1,
                                          self_kv=tuple(written))

    def _final(self, y_BTD):
        return self.final_norm(y_BTD) if self.config.pre_layer_norm else y_BTD

    @staticmethod
    def _masks(inputs_BS, targets_BT, inputs_segments_BS, targets_segments_BT):
        """The shifted decoder input and the two masks of a full (teacher-forced) pass."""
        packed = targets_segments_BT is not None
        if packed != (inputs_segments_BS is not None):
            raise ValueError("packed rows need both inputs_segmentation and targets_segmentation")
        # Key j of the shifted input is valid when target j is: mask by the targets.
        # The causal part (§3.2.3) is added by the decoder layers (`is_causal`).
        self_mask_B1TT = combine_masks(
            padding_mask(targets_BT),
            segment_mask(targets_segments_BT) if packed else None,
        )
        cross_mask_B1TS = combine_masks(
            padding_mask(inputs_BS),
            segment_mask(targets_segments_BT, inputs_segments_BS) if packed else None,
        )
        return shift_right(targets_BT, targets_segments_BT), self_mask_B1TT, cross_mask_B1TS


def _check_shaped_as(ids_BT, name: str, **arrays) -> None:
    """A ValueError unless each of `arrays` (None: not given) broadcasts to the shape of the
    token ids it goes with (positions and segment numbers: one per token; `(1, T)` serves
    every row)."""
    shape = tuple(jnp.shape(ids_BT))
    for other, x in arrays.items():
        try:
            fits = x is None or jnp.broadcast_shapes(jnp.shape(x), shape) == shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{other} must have the shape of {name}, {shape}, got "
                             f"{tuple(jnp.shape(x))}")


def _final_norm(c: ModelConfig) -> LayerNorm:
    return LayerNorm(epsilon=c.layer_norm_epsilon, implementation=c.layer_norm_implementation,
                     name="final_norm")


class Transformer(nn.Module):
    """The encoder-decoder Transformer of Figure 1.

    Packed rows pass `*_positions` (restarting at 0 per example) and
    `*_segmentation` (1, 2, ... per example, 0 for padding).
    """

    config: ModelConfig

    def setup(self):
        if not isinstance(self.config, ModelConfig):
            raise TypeError(f"Transformer takes a ModelConfig, e.g. Transformer(get_model_"
                            f"config('tiny', vocab_size=100)), got {shown(self.config)}")
        self.embedder = Embedder(self.config)
        self.encoder = Encoder(self.config, self.embedder)
        self.decoder = Decoder(self.config, self.embedder)

    def encode(self, inputs, *, inputs_positions=None, inputs_segmentation=None,
               deterministic: bool = True):
        """The encoder's output, the memory `(B, S, D)` of token ids `inputs` `(B, S)`."""
        return self.encoder(inputs, inputs_positions, inputs_segmentation,
                            deterministic=deterministic)

    def decode(self, encoded, inputs, targets, *, targets_positions=None,
               inputs_segmentation=None, targets_segmentation=None,
               deterministic: bool = True):
        """Logits `(B, T, V)` for each target position of `targets` `(B, T)`, given the
        encoder's memory `encoded` `(B, S, D)` of `inputs` `(B, S)` (read for its padding)."""
        return self.decoder(encoded, inputs, targets, targets_positions,
                            inputs_segmentation=inputs_segmentation,
                            targets_segmentation=targets_segmentation,
                            deterministic=deterministic)

    def init_cache(self, encoded, inputs, max_length: int) -> DecodingCache:
        """The decoding cache of a batch (`DecodingCache`), for up to `max_length` tokens.

        The encoder-decoder keys and values are projected from the memory `encoded`
        `(B, S, D)` once, here; the padding of `inputs` `(B, S)` masks them. The
        self-attention keys and values fill one position per `decode_step`.
        """
        return self.decoder.init_cache(encoded, inputs, max_length)

    def decode_step(self, ids, cache: DecodingCache):
        """One step of decoding: the logits `(B, V)` after the previous tokens `ids` `(B, 1)`.

        Start from `init_cache` and ids of `DECODER_START_ID` (0). This is
        the `tokens_to_logits(ids, cache)` that `decoding.py`'s searches call.
        The logits are `__call__`'s at this position but for the padding id's
        (`PAD_ID`, column 0), the lowest float32, so that no search emits it: no
        target token is padding (label smoothing gives it only its share of ε). A
        log-softmax over them is the one over the others alone.
        """
        logits_B1V, cache = self.decoder.step(ids, cache)
        return logits_B1V[:, 0].at[:, PAD_ID].set(jnp.finfo(jnp.float32).min), cache

    def __call__(self, inputs, targets, *, inputs_positions=None, targets_positions=None,
                 inputs_segmentation=None, targets_segmentation=None,
                 deterministic: bool = True):
        """Logits `(B, T, V)` for token ids `inputs` `(B, S)` and `targets` `(B, T)`."""
        return self.embedder.decode(self._features(
            inputs, targets, inputs_positions=inputs_positions,
            targets_positions=targets_positions, inputs_segmentation=inputs_segmentation,
            targets_segmentation=targets_segmentation, deterministic=deterministic))

    def loss(self, inputs, targets, *, label_smoothing: float, chunk_size: int, **kwargs):
        """(Σ loss, Σ weight, Σ correct) of `targets` (§5.4, `output_loss.py`): the pass of
        `__call__` (same keywords) with the output layer and the loss computed
        `chunk_size` target tokens at a time, never the whole `(B, T, V)` logits."""
        return self.embedder.loss(self._features(inputs, targets, **kwargs), targets,
                                  label_smoothing=label_smoothing, chunk_size=chunk_size)

    def _features(self, inputs, targets, *, inputs_positions=None, targets_positions=None,
                  inputs_segmentation=None, targets_segmentation=None,
                  deterministic: bool = True):
        shapes = [tuple(getattr(x, "shape", ())) for x in (inputs, targets)]
        # Only two (B, T) arrays are compared here; `check_ids` names what else is wrong.
        if all(len(shape) == 2 for shape in shapes) and shapes[0][0] != shapes[1][0]:
            raise ValueError(f"inputs {shapes[0]} and targets {shapes[1]} must have the same "
                             f"batch size B: row b of each is one example")
        memory_BSD = self.encode(inputs, inputs_positions=inputs_positions,
                                 inputs_segmentation=inputs_segmentation,
                                 deterministic=deterministic)
        return self.decoder.features(memory_BSD, inputs, targets, targets_positions,
                                     inputs_segmentation=inputs_segmentation,
                                     targets_segmentation=targets_segmentation,
                                     deterministic=deterministic)


def count_parameters(config: ModelConfig) -> dict[str, int]:
    """Parameter counts per top-level part and in total, without allocating them."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"count_parameters takes a ModelConfig, e.g. "
                        f"get_model_config('base'), got {shown(config)}")
    counts = {name: sum(x.size for x in jax.tree.leaves(tree))
              for name, tree in abstract_params(Transformer(config)).items()}
    counts["total"] = sum(counts.values())
    return counts


def cast_matmul_params(params, dtype):
    """`params` with what the model casts to `dtype` at every use cast once: each dense
    layer's kernel and bias (Flax's `nn.Dense` casts both to its dtype) and the embedding
    table (looked up, then cast; `attend` casts it whole). The layer norms' scale and bias
    stay as they are: they scale in float32 statistics. The model's outputs do not change,
    bit for bit (tests/test_search_with_model.py). Arrays already in `dtype` are returned
    as they are (no copy).

    For a search: the casts of a step inside `lax.while_loop` are not hoisted out of it by
    XLA, so a bfloat16 model cast every matrix at every step: on an H100, 49 kernels a step,
    16 % of beam search's device time (BENCHMARKS.md, "Decoding in bfloat16, traced"). Cast
    once, beam 4 of base in bfloat16 runs 1.06-1.12 × faster on an H200 (BENCHMARKS.md,
    "GPU: H200, 2026-11-27").
    """
    def cast(module):
        dense = "kernel" in module
        return {name: cast(value) if isinstance(value, Mapping)
                else value.astype(dtype) if (dense or name == "embedding")
                and value.dtype != dtype else value
                for name, value in module.items()}

    return cast(params)
