"""pmap's step on one device with and without its sum over the devices, and the `sharded`
step, side by side in one process (BENCHMARKS.md, "model: pmap on one device without its
sum"). Usage: python benchmarks/cpu/pmap_one_device_sum.py base 18 [--json FILE]

Each round runs one step of each, in turn, on the state its last step left; the first two
rounds are warm-up. Prints each program's buffer plan, copies and all-reduces, the median
step, and the median over rounds of the step with the sum (as before 2026-11-29) over this
one's.
"""

import jax

import side_by_side
from transformer_jax import steps
from transformer_jax.benchmark import model as bm


def summed(tree, axis_name):
    """The steps' sum before 2026-11-29: a psum over the axis even where it has one device."""
    return tree if axis_name is None else jax.lax.psum(tree, axis_name)


def main():
    args = side_by_side.arguments(strategy=False)
    config, batch = side_by_side.full_rows(args.model)
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
    side_by_side.timed(runs, rows, args.rounds, "pmap, summed", "summed_over_this")
    for label, row in rows.items():
        print(f"{args.model:5} {label:13}", row)
    side_by_side.write_json(args.json, args, rows)


if __name__ == "__main__":
    main()
