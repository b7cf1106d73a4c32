"""pmap's step on one device with and without its sum over the devices, and the `sharded`
step, side by side in one process (BENCHMARKS.md, "model: pmap on one device without its
sum"). Usage: python benchmarks/cpu/pmap_one_device_sum.py base 18 [--json FILE]

Each round runs one step of each, in turn, on the state its last step left; the first two
rounds are warm-up. Prints each program's buffer plan, copies and all-reduces, the median
step, and the median over rounds of the step with the sum (as before 2026-11-29) over this
one's.
"""

import argparse
import dataclasses
import json

import jax
import numpy as np

from transformer_jax import steps
from transformer_jax.benchmark import model as bm
from transformer_jax.benchmark import timing


def summed(tree, axis_name):
    """The steps' sum before 2026-11-29: a psum over the axis even where it has one device."""
    return tree if axis_name is None else jax.lax.psum(tree, axis_name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=("tiny", "small", "base"))
    parser.add_argument("rounds", type=int)
    parser.add_argument("--json")
    args = parser.parse_args()
    case = next(c for c in bm.cases(False) if c.name == args.model)
    config = dataclasses.replace(case.config, dtype="float32")
    batch = bm.synthetic_batch(config, case.batch, case.length)
    variants = (("pmap, summed", summed, "pmap"), ("pmap", steps._psum, "pmap"),
                ("sharded", steps._psum, "sharded"))
    runs, rows = {}, {}
    for label, psum, strategy in variants:
        steps._psum = psum  # read when the step is traced, inside train_setup
        step, state, placed, _, _ = bm.train_setup(config, strategy, batch)
        text = step.as_text()
        runs[label] = [step, state, placed]
        rows[label] = {"memory_bytes": bm.memory_bytes(step), "copies": text.count(" copy("),
                       "all_reduces": text.count(" all-reduce(")}
    times = timing.alternated_steps(runs, args.rounds)
    before = np.array(times["pmap, summed"])
    for label, row in rows.items():
        row["step_ms"] = 1e3 * float(np.median(times[label]))
        row["summed_over_this"] = float(np.median(before / np.array(times[label])))
        print(f"{args.model:5} {label:13}", row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "rounds": args.rounds, "devices": str(jax.devices()),
                       "jax": jax.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
