"""Benchmarks of the compiled pieces: attention kernels, the train step, decoding, input.

    python -m transformer_jax.benchmark SUITE [--quick] [--json=FILE] [--plot=FILE.png]

Suites (each a module here whose `run(quick) -> (rows, notes)` returns one dict per case,
each passed to `report.measured` as it is measured, so that --json keeps it at once):

    attention  every available attention implementation: TFLOP/s and peak fraction; on the
               masks of training (packed rows), also the error against float32
    model      train-step target tokens/s, compile time and MFU per preset, dtype, strategy
    decode     greedy and beam-4 decoding, with and without the key/value cache
    pipeline   packed batches per second and fill, ours beside grain's packers; a WMT-size
               generated corpus: preparation, first batch, resume, memory
    compare    the same train step in PyTorch's torch.nn.Transformer, and Flax's attention
    loss       the output layer and smoothed loss alone: the whole logits, in chunks, and
               tokamax's kernel where it is installed

Every figure is a median over timed calls after warm-up calls, each call waited
for with `block_until_ready`; every suite compares within one run.
"""

SUITES = ("attention", "model", "decode", "pipeline", "compare", "loss")
