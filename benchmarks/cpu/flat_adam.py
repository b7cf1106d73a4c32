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

import functools

import jax
import numpy as np
import optax

import side_by_side
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
    args = side_by_side.arguments(strategy=True)
    config, batch = side_by_side.full_rows(args.model)
    runs = {label: setup(config, args.strategy, batch, flat)
            for label, flat in (("per array", False), ("one vector", True))}
    rows = {label: {"memory_bytes": bm.memory_bytes(run[0])} for label, run in runs.items()}
    side_by_side.timed(runs, rows, args.rounds, "per array", "per_array_over_this")
    for label, row in rows.items():
        print(f"{args.model:5} {args.strategy:8} {label:10}", row)
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree.leaves(jax.device_get(runs["per array"][1].params)),
        jax.tree.leaves(jax.device_get(runs["one vector"][1].params))))
    print(f"largest parameter difference after {args.rounds} steps: {gap:.2e}")
    side_by_side.write_json(args.json, args, rows, optax=optax.__version__, parameter_gap=gap)


if __name__ == "__main__":
    main()
