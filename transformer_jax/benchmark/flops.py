"""FLOP counts the benchmarks divide by: the model's arithmetic, not what a kernel happens to do.

A multiply-add is 2 FLOPs; only matmuls are counted (softmax, layer norms and
the optimizer are a few percent and are left out, as in MFU reports).
"""

from transformer_jax.model_config import ModelConfig


def attention_flops(batch: int, q_len: int, kv_len: int, num_heads: int, head_dim: int, *,
                    causal: bool = False, backward: bool = False) -> float:
    """FLOPs of softmax(Q Kᵀ / √H) V (eq. 1) for `(B, T, N, H)` queries over S keys.

    Forward: the two matmuls Q Kᵀ and P V, 2 · 2·B·N·T·S·H. Causal attention needs
    only the lower triangle, so it counts half (FlashAttention's convention; an
    implementation that computes the full square and masks it gets no credit for
    the masked half). Backward is 2.5× the forward (five matmuls, the scores
    recomputed: dV, dP, dQ, dK and Q Kᵀ), so forward+backward is 3.5× forward.
    """
    forward = 4.0 * batch * num_heads * q_len * kv_len * head_dim
    if causal:
        forward /= 2
    return forward * 3.5 if backward else forward


def forward_flops(config: ModelConfig, batch: int, source_len: int, target_len: int, *,
                  attention: bool = True) -> float:
    """Matmul FLOPs of one forward pass of the encoder-decoder over (B, S) and (B, T) tokens.

    Per source token, each encoder layer: Q, K, V, O projections 2·4D², the
    feed-forward 2·2DF, attention over S keys 2·2SD. Per target token, each decoder
    layer: self-attention 2·4D² + 2·2TD (the full square: MFU's model FLOPs; cuDNN's
    causal kernel computes about half of the 2·2TD), cross-attention
    Q and O 2·2D² + 2·2SD, its K and V 2·2D² per source token, the feed-forward
    2·2DF; then the tied output projection 2DV. Embedding lookups are gathers: 0.
    `attention=False` leaves out the 2·2SD and 2·2TD terms (softmax(Q Kᵀ) V itself),
    the count of MFU "without attention".
    """
    d, f, v, layers = config.d_model, config.d_ff, config.vocab_size, config.num_layers
    s_tokens, t_tokens = batch * source_len, batch * target_len
    keys = 1 if attention else 0
    encoder = s_tokens * (8 * d * d + 4 * d * f + keys * 4 * source_len * d)
    decoder = (t_tokens * (8 * d * d + keys * 4 * target_len * d + 4 * d * d
                           + keys * 4 * source_len * d + 4 * d * f)
               + s_tokens * 4 * d * d)
    return layers * (encoder + decoder) + t_tokens * 2 * d * v


def train_step_flops(config: ModelConfig, batch: int, source_len: int, target_len: int, *,
                     attention: bool = True) -> float:
    """A train step is the forward plus a backward of twice its matmuls: 3× forward."""
    return 3.0 * forward_flops(config, batch, source_len, target_len, attention=attention)
