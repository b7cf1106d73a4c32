"""What this folder's scripts share: train steps of one model, each compiled in one process
and run in turn (`timing.alternated_steps`), each row's step and the median over rounds of
a baseline's step over its own.

Each script runs as `python benchmarks/cpu/SCRIPT.py MODEL [STRATEGY] ROUNDS [--json FILE]`
(Python puts this folder first on the path, so they import this module).
"""

import argparse
import dataclasses
import json

import jax
import numpy as np

from transformer_jax.benchmark import model as bm
from transformer_jax.benchmark import timing


def arguments(*, strategy: bool) -> argparse.Namespace:
    """MODEL, then STRATEGY if `strategy`, ROUNDS and --json FILE."""
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=("tiny", "small", "base"))
    if strategy:
        parser.add_argument("strategy", choices=("pmap", "sharded"))
    parser.add_argument("rounds", type=int)
    parser.add_argument("--json")
    return parser.parse_args()


def full_rows(model: str) -> tuple:
    """(config, batch): the `model` suite's CPU case of `model` in float32, full rows."""
    case = next(c for c in bm.cases(False) if c.name == model)
    config = dataclasses.replace(case.config, dtype="float32")
    return config, bm.synthetic_batch(config, case.batch, case.length)


def timed(runs: dict, rows: dict, rounds: int, baseline: str, column: str) -> None:
    """Times `runs` ({label: [step, state, batch]}) in turn and adds to each of `rows`
    ({label: {...}}) its median step and, as `column`, the median over rounds of
    `baseline`'s step over its own."""
    times = timing.alternated_steps(runs, rounds)
    before = np.array(times[baseline])
    for label, row in rows.items():
        row["step_ms"] = 1e3 * float(np.median(times[label]))
        row[column] = float(np.median(before / np.array(times[label])))


def write_json(path: str | None, args: argparse.Namespace, rows: dict, **more) -> None:
    """The arguments, the devices, JAX's version, `more` and the rows, if `path`."""
    if path:
        with open(path, "w") as f:
            json.dump({**{k: v for k, v in vars(args).items() if k != "json"},
                       "devices": str(jax.devices()), "jax": jax.__version__, **more,
                       "rows": rows}, f, indent=1)
