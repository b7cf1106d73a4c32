"""The train step compiled with and without XLA's region analysis in copy insertion
(`xla_cpu_copy_insertion_use_region_analysis`, XLA's default: off), side by side in one
process (BENCHMARKS.md, "model: copy insertion by region").
Usage: python benchmarks/cpu/copy_region_analysis.py base sharded 18 [--json FILE]

Each round runs one step of each program, in turn, on the state its last step left; the
first two rounds are warm-up. Prints each program's buffer plan and copies (of entry
parameters, and all), the median step, and the median over rounds of the default's step
over the other's.
"""

import re

import side_by_side
from transformer_jax.benchmark import model as bm

OPTION = "xla_cpu_copy_insertion_use_region_analysis"


def copies(text: str) -> dict:
    """The program's copies: all, and those of an entry parameter (a parameter's name)."""
    parameters = set(re.findall(r"(%[\w.\-]+) = \S+ parameter\(", text))
    sources = re.findall(r"= \S+ copy\((%[\w.\-]+)\)", text)
    return {"copies": len(sources), "parameter_copies": sum(s in parameters for s in sources)}


def main():
    args = side_by_side.arguments(strategy=True)
    config, batch = side_by_side.full_rows(args.model)
    runs, rows = {}, {}
    for label, options in (("default", {OPTION: False}), ("region analysis", {OPTION: True})):
        step, state, placed, _, _ = bm.train_setup(config, args.strategy, batch,
                                                   xla_options=options)
        runs[label] = [step, state, placed]
        rows[label] = {"memory_bytes": bm.memory_bytes(step), **copies(step.as_text())}
    side_by_side.timed(runs, rows, args.rounds, "default", "default_over_this")
    for label, row in rows.items():
        print(f"{args.model:5} {args.strategy:8} {label:16}", row)
    side_by_side.write_json(args.json, args, rows)


if __name__ == "__main__":
    main()
