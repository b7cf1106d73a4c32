"""kill -9 at random moments of a training run, then resume: does any kill lose the run?

    python tests/kill_matrix.py [--kills=20] [--seed=0]

A tiny model trains on the small numbers split for 60 steps, checkpointing every 5 (async,
so kills land during saves too). Each round starts `train.py` on the same workdir, waits a
random 1-12 s (some kills land while data is read or the step compiles), and kills it with
SIGKILL. Then one run goes to the end. The figure: how many kills the next start resumed
from without an error, and whether the final loss equals that of a run never killed (exact
resume). Not part of the test suite (minutes of training); its result is in docs/faults.md.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--config=configs/default.py", "--config.model.d_model=32", "--config.model.d_ff=64",
         "--config.model.num_layers=2", "--config.data.numbers_size=small",
         "--config.optim.warmup_steps=10",
         "--config.num_train_steps=60", "--config.checkpoint_every_steps=5",
         "--config.log_every_steps=5", "--config.eval_every_steps=60",
         "--config.decode.bleu_every_steps=0"]


def start(workdir):
    return subprocess.Popen([sys.executable, "train.py", f"--workdir={workdir}", *FLAGS],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def losses(workdir) -> dict[int, float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        straight = os.path.join(scratch, "straight")
        done = start(straight).communicate()
        killed, errors = os.path.join(scratch, "killed"), []
        for round_ in range(args.kills):
            process = start(killed)
            time.sleep(rng.uniform(1, 12))
            if process.poll() is not None:  # finished, or failed to resume
                out, err = process.communicate()
                if process.returncode != 0:
                    errors.append((round_, err.strip().splitlines()[-1:]))
                break
            process.send_signal(signal.SIGKILL)
            process.communicate()
        final = start(killed)
        out, err = final.communicate()
        if final.returncode != 0:
            errors.append(("final", err.strip().splitlines()[-1:]))
        same = losses(killed).get(60) == losses(straight).get(60)
        print(f"{round_ + 1} kills, {len(errors)} failed starts {errors}; final exit "
              f"{final.returncode}; loss at step 60 equal to the run never killed: {same} "
              f"({losses(killed).get(60)} vs {losses(straight).get(60)})")
        del done, out
        return 0 if not errors and same else 1


if __name__ == "__main__":
    sys.exit(main())
