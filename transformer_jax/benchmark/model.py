"""The `model` suite: the whole train step (forward, backward, Adam) per preset and strategy.

Synthetic full rows of random token ids (no padding), the paper's optimizer and
label smoothing; target tokens/s = B·T / the median step time. MFU is
`train_step_flops` (flops.py) per second over the device peak (on CPUs, the
matmul rate measured in the same run).
"""

import dataclasses
import functools

import jax
import tqdm
import numpy as np

from transformer_jax.benchmark.flops import train_step_flops
from transformer_jax.benchmark.machine import peak_tflops
from transformer_jax.benchmark.timing import compile_seconds, median_seconds
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig, get_model_config
from transformer_jax.optim import learning_rate_schedule, make_optimizer
from transformer_jax.parallel import STRATEGIES, Parallel
from transformer_jax.steps import TrainState, train_step


@dataclasses.dataclass(frozen=True)
class Case:
    """A model and the batch it is timed on: `batch` rows of `length` source and target tokens."""

    name: str
    config: ModelConfig
    batch: int
    length: int


def model_configs() -> dict[str, ModelConfig]:
    """The presets, plus "small": a model a laptop trains (the compare suite's second size)."""
    return {
        "tiny": get_model_config("tiny"),
        # Not a preset: d_model 256, 4 heads, d_ff 1024, 3 layers; V = 8000, the size of a
        # SentencePiece vocabulary for a corpus of a few million words.
        "small": get_model_config("base", vocab_size=8000, d_model=256, num_heads=4, d_ff=1024,
                                  num_layers=3),
        "base": get_model_config("base"),
        "big": get_model_config("big"),
    }


def cases(quick: bool) -> list[Case]:
    """CPUs get short rows and no big model (a step takes seconds there, and the suite should
    take minutes); accelerators get rows near the paper's 25k-token batches."""
    configs = model_configs()
    if quick:
        return [Case("tiny", configs["tiny"], 8, 16)]
    if jax.default_backend() == "cpu":
        sizes = {"tiny": (16, 32), "small": (16, 32), "base": (8, 32)}
    else:
        sizes = {"tiny": (256, 64), "small": (128, 128), "base": (64, 256), "big": (32, 256)}
    return [Case(name, configs[name], *shape) for name, shape in sizes.items()]


def synthetic_batch(config: ModelConfig, batch: int, length: int, seed: int = 0) -> dict:
    """Full rows of random ids in [4, V): no padding, no packing (numpy, like the pipeline's)."""
    rng = np.random.default_rng(seed)
    low = min(4, config.vocab_size - 1)
    return {key: rng.integers(low, config.vocab_size, (batch, length), dtype=np.int32)
            for key in ("inputs", "targets")}


def train_setup(config: ModelConfig, strategy: str, batch: dict):
    """(compiled step, placed state, placed batch, compile seconds) as the trainer runs them."""
    parallel = Parallel(strategy)
    model = Transformer(config)
    tx = make_optimizer(d_model=config.d_model)
    params = jax.jit(model.init)(jax.random.key(0), batch["inputs"][:1], batch["targets"][:1])
    state = parallel.put_state(TrainState.create(apply_fn=model.apply,
                                                 params=params["params"], tx=tx))
    step_fn = functools.partial(train_step, model=model, seed=0, label_smoothing=0.1,
                                learning_rate_fn=learning_rate_schedule(d_model=config.d_model))
    placed = parallel.put_batch(batch)
    step, seconds = compile_seconds(parallel.compile_train_step(step_fn), state, placed)
    return step, state, placed, seconds


def time_train_step(case: Case, dtype: str, strategy: str, *, quick: bool) -> dict:
    config = dataclasses.replace(case.config, dtype=dtype)
    batch = synthetic_batch(config, case.batch, case.length)
    step, state, placed, compile_s = train_setup(config, strategy, batch)
    holder = [state]

    def run_once():
        holder[0], metrics = step(holder[0], placed)
        jax.block_until_ready(metrics)

    seconds = median_seconds(run_once, warmup=1 if quick else 2, iters=3 if quick else 10)
    flops = train_step_flops(config, case.batch, case.length, case.length)
    peak, _ = peak_tflops(dtype, quick=quick)
    tflops = flops / seconds / 1e12
    return {"model": case.name, "dtype": dtype, "strategy": strategy, "batch": case.batch,
            "length": case.length, "step_ms": seconds * 1e3,
            "tokens_per_sec": case.batch * case.length / seconds,
            "compile_s": compile_s, "tflops": tflops, "mfu": tflops / peak if peak else None}


def run(quick: bool = False, *, models=None, dtypes=None,
        strategies=STRATEGIES) -> tuple[list[dict], list[str]]:
    """(one row per model × dtype × strategy, notes); `models` picks among `cases(quick)`."""
    dtypes = dtypes or (("float32",) if quick else ("float32", "bfloat16"))
    chosen = [case for case in cases(quick) if models is None or case.name in models]
    if not chosen:
        raise ValueError(f"no model among {models}; this backend times "
                         f"{[case.name for case in cases(quick)]}")
    grid = [(case, dtype, strategy)
            for case in chosen for dtype in dtypes for strategy in strategies]
    rows = [time_train_step(*case, quick=quick)
            for case in tqdm.tqdm(grid, desc="model", disable=quick)]
    _, source = peak_tflops("float32", quick=quick)
    return rows, [f"peak: {source}", "tokens_per_sec: target tokens (B·T) per second",
                  "tflops: train_step_flops() in transformer_jax/benchmark/flops.py"]
