"""The first GPU measurements: attention on packed masks, the train step before and after, torch.

    python benchmarks/h100/probe.py [masks] [steps] [torch] [--json=FILE]

    masks  bfloat16 attention on packed rows: error against a float32 reference over the
           real queries (forward and gradients), then wall time of one jitted call at the
           base and big models' shapes, for cuDNN with the mask as a bias (what "cudnn"
           runs), XLA, cuDNN without a mask (for scale), Pallas's Triton `mha` with
           segment ids, and cuDNN's packed layout (segment offsets, a private JAX API)
    steps  the base train step on 96 packed rows of 256 tokens, bfloat16: this code and the
           code before the loss and embedding changes side by side, a kernel profile, the
           "rbg" PRNG for dropout, and the big model
    torch  torch.nn.Transformer of the base sizes under bfloat16 autocast, full 96 x 256 rows

Exploratory: the suites of `python -m transformer_jax.benchmark` are the measurements to keep.
The runs behind BENCHMARKS.md's GPU section are described in this folder's README.
"""

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.attention import dot_product_attention
from transformer_jax.benchmark import machine, profile, report
from transformer_jax.benchmark import model as model_suite
from transformer_jax.benchmark.flops import train_step_flops
from transformer_jax.benchmark.timing import median_seconds


def packed_mask_B1TS(query_segments_BT, key_segments_BS, causal):
    mask = ((query_segments_BT[:, None, :, None] == key_segments_BS[:, None, None, :])
            & (key_segments_BS[:, None, None, :] != 0))
    if causal:
        mask &= jnp.tril(jnp.ones((query_segments_BT.shape[1], key_segments_BS.shape[1]), bool))
    return mask


def cudnn_offsets_and_lengths(segments_BT, max_segments):
    """cuDNN's packed layout: each segment's start and length per row, -1 where none."""
    ids_M = jnp.arange(1, max_segments + 1)
    lengths_BM = (segments_BT[:, None, :] == ids_M[None, :, None]).sum(-1).astype(jnp.int32)
    starts_BM = jnp.cumsum(lengths_BM, -1) - lengths_BM
    count_B1 = (lengths_BM > 0).sum(-1, keepdims=True)
    index_M1 = jnp.arange(max_segments + 1)[None]
    offsets = jnp.where(index_M1 < count_B1, jnp.pad(starts_BM, ((0, 0), (0, 1))), -1)
    return offsets.astype(jnp.int32), jnp.where(lengths_BM > 0, lengths_BM, -1)


def implementations(query_segments_BT, key_segments_BS, causal, max_segments):
    """name -> attend(q, k, v) for one mask."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_private

    mask = packed_mask_B1TS(query_segments_BT, key_segments_BS, causal)
    q_offsets, q_lengths = cudnn_offsets_and_lengths(query_segments_BT, max_segments)
    k_offsets, k_lengths = cudnn_offsets_and_lengths(key_segments_BS, max_segments)
    mask_type = cudnn_private.MaskType.PADDING_CAUSAL if causal else cudnn_private.MaskType.PADDING
    fns = {
        "xla": lambda q, k, v: dot_product_attention(q, k, v, mask, implementation="xla"),
        "cudnn": lambda q, k, v: dot_product_attention(q, k, v, mask, implementation="cudnn"),
        "cudnn_offsets": lambda q, k, v: cudnn_private.dot_product_attention(
            q, k, v, None, None, q_lengths, k_lengths, q_offsets, k_offsets,
            scale=q.shape[-1] ** -0.5, mask_type=mask_type),
    }
    if query_segments_BT is key_segments_BS:  # Pallas's kernel takes one set of segment ids
        from jax.experimental.pallas.ops.gpu import attention as pallas_attention

        fns["pallas_mha"] = lambda q, k, v: pallas_attention.mha(
            q, k, v, segment_ids=query_segments_BT, sm_scale=q.shape[-1] ** -0.5, causal=causal)
    return fns, mask


def attention_errors(t=128, s=None, causal=False, max_segments=32, seed=1):
    """Relative errors against float32 (forward, dq, dk, dv) over the real queries."""
    rng = np.random.default_rng(seed)
    query_segments = jnp.asarray(model_suite.packed_segments_BT(rng, 4, t))
    key_segments = query_segments
    if s is not None:  # encoder-decoder: the same examples, 3..9 source tokens each
        keys = np.zeros((4, s), np.int32)
        for row, segments in enumerate(np.asarray(query_segments)):
            sizes = rng.integers(3, 10, segments.max())
            keys[row, :sizes.sum()] = np.repeat(np.arange(1, segments.max() + 1), sizes)
        key_segments = jnp.asarray(keys)
    fns, mask = implementations(query_segments, key_segments, causal, max_segments)
    q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key, shape in zip(
        jax.random.split(jax.random.key(0), 3),
        ((4, t, 4, 64), (4, key_segments.shape[1], 4, 64), (4, key_segments.shape[1], 4, 64))))
    real = (query_segments != 0)[:, :, None, None]
    dout = jax.random.normal(jax.random.key(1), q.shape, jnp.float32) * real

    def outputs(attend, dtype):
        loss = lambda *qkv: jnp.sum(attend(*(x.astype(dtype) for x in qkv)).astype(  # noqa: E731
            jnp.float32) * dout)
        return (attend(*(x.astype(dtype) for x in (q, k, v))).astype(jnp.float32) * real,
                *jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))

    reference = outputs(lambda q, k, v: dot_product_attention(q, k, v, mask), jnp.float32)
    errors = {}
    for name, attend in fns.items():
        try:
            got = outputs(jax.jit(attend), jnp.bfloat16)
            errors[name] = [float(jnp.linalg.norm(g.astype(jnp.float32) - r) / jnp.linalg.norm(r))
                            for g, r in zip(got, reference)]
        except Exception as error:  # noqa: BLE001 (a probe reports what fails)
            errors[name] = f"{type(error).__name__}: {str(error)[:200]}"
    return errors


def attention_times(batch, length, heads, causal, max_segments):
    """ms of one jitted call (wall clock, dispatch included), forward and forward+backward."""
    segments = jnp.asarray(model_suite.packed_segments_BT(np.random.default_rng(0), batch, length))
    fns, _ = implementations(segments, segments, causal, max_segments)
    fns["cudnn_no_mask"] = lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, implementation="cudnn")
    q, k, v = (jax.random.normal(key, (batch, length, heads, 64), jnp.bfloat16)
               for key in jax.random.split(jax.random.key(0), 3))
    times = {}
    for name, attend in fns.items():
        backward = jax.grad(lambda *qkv: attend(*qkv).astype(jnp.float32).sum(), argnums=(0, 1, 2))
        try:
            times[name] = {pass_: 1e3 * median_seconds(
                lambda f=jax.jit(f): jax.block_until_ready(f(q, k, v)), warmup=2, iters=20)
                for pass_, f in (("forward", attend), ("fwd+bwd", backward))}
        except Exception as error:  # noqa: BLE001
            times[name] = f"{type(error).__name__}: {str(error)[:200]}"
    return times


def masks() -> dict:
    return {
        "errors, self, packed": attention_errors(),
        "errors, self, packed, causal": attention_errors(causal=True),
        "errors, encoder-decoder, packed": attention_errors(s=96),
        "errors, causal, T=127": attention_errors(t=127, causal=True),
        "ms, base, 96x256, 8 heads, causal": attention_times(96, 256, 8, True, 32),
        "ms, big, 48x512, 16 heads, causal": attention_times(48, 512, 16, True, 64),
    }


# --- the train step ------------------------------------------------------------------------


def before_changes():
    """The code before the loss and embedding changes: nn.Embed's lookup, log_softmax + gather."""
    import transformer_jax.model as model_module
    import transformer_jax.steps as steps_module

    def encode(self, tokens_BT):
        return self.table(tokens_BT) * jnp.sqrt(self.config.d_model).astype(self.config.dtype)

    def loss(logits_BTV, targets_BT, *, label_smoothing=0.0):
        vocab, confidence = logits_BTV.shape[-1], 1.0 - label_smoothing
        low = label_smoothing / (vocab - 1)
        entropy = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low + 1e-20))
        logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
        logp_target_BT = jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
        loss_BT = -(low * logp_BTV.sum(-1) + (confidence - low) * logp_target_BT) - entropy
        weights_BT = (targets_BT != 0).astype(jnp.float32)
        return (loss_BT * weights_BT).sum(), weights_BT.sum()

    return [(model_module.Embedder, "encode", encode),
            (steps_module, "label_smoothed_cross_entropy", loss)]


def train_step(name="base", *, patches=(), prng=None, trace_dir=None, batch=96, length=256):
    """ms per step (median of 10 after 3), MFU, temporaries; with `trace_dir`, a kernel profile."""
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    for owner, attr, value in patches:
        setattr(owner, attr, value)
    if prng:
        jax.config.update("jax_default_prng_impl", prng)
    try:
        config = dataclasses.replace(model_suite.model_configs()[name], dtype="bfloat16")
        rows = model_suite.packed_batch(config, batch, length)
        step, state, placed, compile_s = model_suite.train_setup(config, "sharded", rows)
        holder = [state]

        def once():
            holder[0], metrics = step(holder[0], placed)
            jax.block_until_ready(metrics)

        seconds = median_seconds(once, warmup=3, iters=10)
        if trace_dir:
            jax.profiler.start_trace(trace_dir)
            for _ in range(3):
                once()
            jax.profiler.stop_trace()
        flops = train_step_flops(config, batch, length, length)
        return {"model": name, "step_ms": seconds * 1e3, "row_tokens_per_s": batch * length / seconds,
                "real_target_tokens": int((rows["targets"] != 0).sum()),
                "mfu": flops / seconds / 989e12, "compile_s": compile_s,
                "temp_gb": step.memory_analysis().temp_size_in_bytes / 1e9,
                **({"profile_per_3_steps": profile.summarize(trace_dir, top=40)} if trace_dir else {})}
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)
        if prng:
            jax.config.update("jax_default_prng_impl", "threefry2x32")


def steps() -> dict:
    return {"base": train_step(trace_dir="/tmp/probe-profile-base"),
            "base, before the changes": train_step(patches=before_changes()),
            "base, rbg dropout": train_step(prng="rbg"),
            "big": train_step("big", trace_dir="/tmp/probe-profile-big")}


def torch() -> dict:
    import torch as pytorch

    from transformer_jax.benchmark import torch_peer

    config = model_suite.model_configs()["base"]
    step = torch_peer.train_step_fn(config, model_suite.synthetic_batch(config, 96, 256), "cuda")
    with pytorch.autocast("cuda", dtype=pytorch.bfloat16):
        seconds = median_seconds(step, warmup=3, iters=10)
    return {"torch": pytorch.__version__, "bf16_autocast_step_ms": seconds * 1e3}


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", choices=("masks", "steps", "torch"),
                        default=["masks", "steps", "torch"])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    results = {"machine": machine.describe()}
    for name in args.sections:
        start = time.perf_counter()
        try:
            results[name] = globals()[name]()
        except Exception:  # noqa: BLE001 (a probe reports what fails and goes on)
            results[name] = traceback.format_exc(limit=3)
        print(f"== {name} ({time.perf_counter() - start:.0f} s)")
        print(json.dumps(results[name], indent=1, default=str))
    if args.json:
        report.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
