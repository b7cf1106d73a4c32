"""The train step compiled with and without XLA's region analysis in copy insertion
(`xla_cpu_copy_insertion_use_region_analysis`, XLA's default: off), side by side in one
process (BENCHMARKS.md, "model: copy insertion by region").
Usage: python benchmarks/cpu/copy_region_analysis.py base sharded 18 [--json FILE]

Each round runs one step of each program, in turn, on the state its last step left; the
first two rounds are warm-up. Prints each program's buffer plan and copies (of entry
parameters, and all), the median step, and the median over rounds of the default's step
over the other's.
"""

import argparse
import dataclasses
import json
import re

import jax
import numpy as np

from transformer_jax.benchmark import model as bm
from transformer_jax.benchmark import timing

OPTION = "xla_cpu_copy_insertion_use_region_analysis"


def copies(text: str) -> dict:
    """The program's copies: all, and those of an entry parameter (a parameter's name)."""
    parameters = set(re.findall(r"(%[\w.\-]+) = \S+ parameter\(", text))
    sources = re.findall(r"= \S+ copy\((%[\w.\-]+)\)", text)
    return {"copies": len(sources), "parameter_copies": sum(s in parameters for s in sources)}


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
    runs, rows = {}, {}
    for label, options in (("default", {OPTION: False}), ("region analysis", {OPTION: True})):
        step, state, placed, _, _ = bm.train_setup(config, args.strategy, batch,
                                                   xla_options=options)
        runs[label] = [step, state, placed]
        rows[label] = {"memory_bytes": bm.memory_bytes(step), **copies(step.as_text())}
    times = timing.alternated_steps(runs, args.rounds)
    default = np.array(times["default"])
    for label, row in rows.items():
        row["step_ms"] = 1e3 * float(np.median(times[label]))
        row["default_over_this"] = float(np.median(default / np.array(times[label])))
        print(f"{args.model:5} {args.strategy:8} {label:16}", row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "strategy": args.strategy, "rounds": args.rounds,
                       "devices": str(jax.devices()), "jax": jax.__version__, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
