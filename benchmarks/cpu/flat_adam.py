"""The train step with the paper's Adam (`optim.make_optimizer`, one update per parameter
array) and with the same Adam over all parameters raveled into one vector
(`optax.flatten`), side by side in one process (BENCHMARKS.md, "model: Adam over one
vector").
Usage: python benchmarks/cpu/flat_adam.py small sharded 12 [--json FILE]

Each round runs one step of each program, in turn, on the state its last step left; the
first two rounds are warm-up. Prints each program's buffer plan, the median step, the
median over rounds of the per-array step over this one, and after the last round the
largest difference between the two programs' parameters.
"""

import argparse
import dataclasses
import functools
import json

import jax
import numpy as np
import optax

from transformer_jax.benchmark import model as bm
from transformer_jax.benchmark import timing
from transformer_jax.model import Transformer
from transformer_jax.optim import make_optimizer
from transformer_jax.parallel import Parallel
from transformer_jax.steps import train_step


def setup(config, strategy: str, batch: dict, flat: bool) -> list:
    """[compiled step, placed state, placed batch], as `bm.train_setup` builds them."""
    parallel, model = Parallel(strategy), Transformer(config)
    optimizer = make_optimizer(d_model=config.d_model)
    tx = optax.flatten(optimizer.tx) if flat else optimizer.tx
    state, _ = bm.fresh_state(parallel, model, tx)
    step_fn = functools.partial(train_step, model=model, seed=0, label_smoothing=0.1,
                                learning_rate_fn=optimizer.learning_rate_fn)
    placed = parallel.put_batch(batch)
    step, _ = timing.compile_seconds(parallel.compile_train_step(step_fn), state, placed)
    return [step, state, placed]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=("tiny", "small", "base"))
    parser.add_argument("strategy", choices=("pmap", "sharded"))
    parser.add_argument("rounds", type=int)
    parser.add_argument("--json")
    args = parser.parse_args()
    case = next(c for c in bm.cases(False) if c.name == args.model)
    config = dataclasses.replace(case.config, dtype="float32")
    batch = bm.synthetic_batch(config, case.batch, case.length)
    runs = {label: setup(config, args.strategy, batch, flat)
            for label, flat in (("per array", False), ("one vector", True))}
    times = timing.alternated_steps(runs, args.rounds)
    per_array = np.array(times["per array"])
    rows = {}
    for label, (step, _, _) in runs.items():
        rows[label] = {"memory_bytes": bm.memory_bytes(step),
                       "step_ms": 1e3 * float(np.median(times[label])),
                       "per_array_over_this": float(np.median(per_array / times[label]))}
        print(f"{args.model:5} {args.strategy:8} {label:10}", rows[label])
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree.leaves(jax.device_get(runs["per array"][1].params)),
        jax.tree.leaves(jax.device_get(runs["one vector"][1].params))))
    print(f"largest parameter difference after {args.rounds} steps: {gap:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "strategy": args.strategy, "rounds": args.rounds,
                       "devices": str(jax.devices()), "jax": jax.__version__,
                       "optax": optax.__version__, "parameter_gap": gap, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
