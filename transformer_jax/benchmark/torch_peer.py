"""The peer a user would otherwise pick: the same encoder-decoder in PyTorch's torch.nn.Transformer.

Same sizes, post-LN layers, dropout, shared embedding scaled by √D, sinusoidal
positions, tied output projection, label smoothing 0.1 and Adam(0.9, 0.98,
1e-9) as ours; one difference torch imposes: nn.Transformer adds a final
LayerNorm to the encoder and to the decoder stack (2 of ~30 norms).
Needs the `bench` extra (torch); imported only by the compare suite.
"""

import functools
import math

import numpy as np

from transformer_jax.model_config import ModelConfig
from transformer_jax.positional import sinusoidal_encoding


def torch_available() -> str:
    """"" when torch can run the comparison, else why not."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed: pip install 'transformer_jax[bench]'"
    return ""


def build(config: ModelConfig, length: int, device: str = "cpu"):
    """`torch.nn.Transformer` as our model: the config's sizes, post-layer-norm, embeddings
    scaled by √d_model with sinusoidal positions of `length` rows (§3.4, §3.5) and the
    output projection tied to the embedding."""
    import torch

    class Seq2Seq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(config.vocab_size, config.d_model)
            self.transformer = torch.nn.Transformer(
                config.d_model, config.num_heads, config.num_layers, config.num_layers,
                config.d_ff, config.dropout_rate, batch_first=True, norm_first=False)
            positions = np.asarray(sinusoidal_encoding(np.arange(length), config.d_model))
            self.register_buffer("positions", torch.from_numpy(positions.copy()))
            self.register_buffer("causal", torch.nn.Transformer.generate_square_subsequent_mask(
                length))
            self.drop = torch.nn.Dropout(config.dropout_rate)

        def embed_positions(self, ids):
            return self.drop(self.embed(ids) * math.sqrt(config.d_model) + self.positions)

        def forward(self, inputs, decoder_inputs):
            y = self.transformer(self.embed_positions(inputs),
                                 self.embed_positions(decoder_inputs),
                                 tgt_mask=self.causal, tgt_is_causal=True)
            return y @ self.embed.weight.T  # tied pre-softmax projection (§3.4)

    return Seq2Seq().to(device)


def train_step_fn(config: ModelConfig, batch: dict, device: str = "cpu", *,
                  autocast: bool = False, compile: bool = False):
    """A zero-argument function doing one training step (and waiting for it); `autocast`
    runs the forward and the loss under bfloat16 autocast (float32 weights and Adam, as
    ours), `compile` wraps the model in torch.compile."""
    import contextlib

    import torch

    length = batch["targets"].shape[1]
    model = build(config, length, device)
    forward = torch.compile(model) if compile else model
    cast = (functools.partial(torch.autocast, device, dtype=torch.bfloat16) if autocast
            else contextlib.nullcontext)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=0)
    inputs = torch.from_numpy(batch["inputs"].astype(np.int64)).to(device)
    targets = torch.from_numpy(batch["targets"].astype(np.int64)).to(device)
    decoder_inputs = torch.nn.functional.pad(targets[:, :-1], (1, 0))  # shifted right

    def step():
        optimizer.zero_grad(set_to_none=True)
        with cast():
            logits = forward(inputs, decoder_inputs)
            loss = loss_fn(logits.reshape(-1, config.vocab_size), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def sdpa_fn(batch: int, seq_len: int, num_heads: int, head_dim: int, *, causal: bool,
            backward: bool, calls: int):
    """A zero-argument function running `calls` bfloat16 calls of
    torch.nn.functional.scaled_dot_product_attention on the CUDA device, flash backend
    only, back to back, then waiting: forward, or forward and the gradients of Q, K, V."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = (batch, num_heads, seq_len, head_dim)  # torch's layout: B, N, T, H
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16,
                           requires_grad=backward) for _ in range(3))
    grad_out = torch.ones(shape, device="cuda", dtype=torch.bfloat16)

    def once():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if backward:
            torch.autograd.grad(out, (q, k, v), grad_out)

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(calls):
                once()
        torch.cuda.synchronize()

    return run
