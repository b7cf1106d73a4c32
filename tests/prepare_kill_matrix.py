"""kill -9 at random moments of `python -m transformer_jax.data prepare`: does any kill leave
a file half written, or lose the preparation?

    python tests/prepare_kill_matrix.py [--kills=20] [--seed=0] [--pairs=1000000]

A folder corpus of `--pairs` short made-up sentence pairs (four parts of 250,000 pairs and
a validation split) is prepared once without a kill, as the reference. Then each round
starts `prepare` on another workdir, waits a random 1-12 s (kills land while the corpus is
read, the tokenizer trains, parts are tokenized, joined and moved into place) and kills it
with SIGKILL; after each kill every file under the workdir is checked whole (a temporary
file aside). A round that finishes before its kill is compared with the reference and its
workdir emptied, so that every kill lands inside a preparation. Then one run goes to the
end. The figures: how many restarts resumed cleanly (no error, no damaged file, the whole
parts of the attempts before kept as they were) and whether the final tokenizer and
prepared ids equal, byte for byte, those of the run never killed; and whether any child
process (the tokenizing workers) still runs 15 s after its caller's kill. Not part of the test
suite (minutes); its result is in docs/faults.md.
"""

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from process_table import children, still_running  # noqa: E402
from transformer_jax.atomic_file import is_temporary  # noqa: E402
from transformer_jax.benchmark.corpus import LANGUAGES, sentences  # noqa: E402
from transformer_jax.data import prepared, prepared_writer  # noqa: E402
from transformer_jax.data.sources import DataError  # noqa: E402
from transformer_jax.data.tokenizer import Tokenizer  # noqa: E402

PART_PAIRS = prepared_writer.PART_PAIRS
VALIDATION_PAIRS = 2000

FLAGS = ["--config=configs/default.py", "--config.data.source_lang=en",
         "--config.data.target_lang=de", "--config.data.vocab_size=2000",
         "--config.data.tokenizer_sentences=50000"]


def write_corpus(folder: str, pairs: int) -> str:
    """train.{en,de} of `pairs` lines of 1-5 made-up words, validation.* of 2,000 lines."""
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for split, size in (("train", pairs), ("validation", VALIDATION_PAIRS)):
        words = rng.integers(1, 6, size)
        for lang, language_seed in LANGUAGES.items():
            with open(os.path.join(folder, f"{split}.{lang}"), "wb") as f:
                f.write(sentences(rng, language_seed, words))
    return folder


def start(corpus: str, workdir: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "transformer_jax.data", "prepare", *FLAGS,
         f"--config.data.dataset=folder:{corpus}", f"--workdir={workdir}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def outputs(workdir: str) -> dict[str, bytes]:
    """Every file the preparation leaves (the lock file aside), by path, with its bytes."""
    found = {}
    for folder, _, names in os.walk(workdir):
        for name in names:
            path = os.path.join(folder, name)
            if name != "train.lock":
                with open(path, "rb") as f:
                    found[os.path.relpath(path, workdir)] = f.read()
    return found


def damaged_files(workdir: str, sizes: dict[str, int]) -> list[str]:
    """The files under `workdir` that are not whole (temporaries aside): the tokenizer and
    its record, each part of a split being prepared (`sizes`: each split's pairs), each
    split prepared."""
    damaged = []
    model = os.path.join(workdir, "tokenizer.model")
    try:
        if os.path.exists(model):
            Tokenizer.load(model)
        if os.path.exists(model + ".json"):
            with open(model + ".json") as f:
                json.load(f)
    except (DataError, ValueError):
        damaged.append(model)
    folder = prepared.prepared_dir(workdir)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if name.endswith(".partial"):
            pairs = sizes[name.removesuffix(".partial")]
            damaged += [p for p in parts(path) if prepared_writer._part_damage(
                p, min(PART_PAIRS, pairs - _index(p) * PART_PAIRS), np.uint16) is not None]
        else:
            try:
                prepared.PreparedSplit(path).check()
            except DataError:
                damaged.append(path)
    return damaged


def _index(part: str) -> int:
    """k of part-k.npz."""
    return int(os.path.basename(part).removeprefix("part-").removesuffix(".npz"))


def parts(partial: str) -> dict[str, int]:
    """The parts in a split's partial folder, by path, with their modification times."""
    if not os.path.isdir(partial):
        return {}
    return {os.path.join(partial, n): os.stat(os.path.join(partial, n)).st_mtime_ns
            for n in os.listdir(partial) if n.startswith("part-") and not is_temporary(n)}


def moment(workdir: str) -> str:
    """Where the preparation in `workdir` was, from what it left."""
    folder = prepared.prepared_dir(workdir)
    if not os.path.exists(os.path.join(workdir, "tokenizer.model")):
        return "reading, training the tokenizer"
    for split in prepared.PREPARED_SPLITS:
        if os.path.exists(os.path.join(folder, f"{split}.partial", "manifest.json")):
            return f"moving {split} into place"
        if os.path.isdir(os.path.join(folder, f"{split}.partial")):
            return f"{split}: {len(parts(os.path.join(folder, f'{split}.partial')))} parts"
        if not os.path.isdir(os.path.join(folder, split)):
            return f"{split} not begun"
    return "done"


def leftovers(workdir: str) -> list[str]:
    """Temporary files and partial folders: none may be left by a finished preparation."""
    return [os.path.join(folder, name) for folder, dirs, names in os.walk(workdir)
            for name in dirs + names if is_temporary(name) or name.endswith(".partial")]


def kill_rounds(args, corpus: str, killed: str, reference: dict) -> dict:
    """The rounds of start, wait, SIGKILL: what each start did with what the last left."""
    rng, partial = random.Random(args.seed), os.path.join(killed, "prepared", "train.partial")
    sizes = {"train": args.pairs, "validation": VALIDATION_PAIRS}
    tally = {"kills": 0, "resumes": 0, "clean": 0, "finished": 0, "unequal": 0,
             "workers": 0, "orphans": 0,
             "damaged": [], "errors": [], "moments": collections.Counter()}
    while tally["kills"] < args.kills:
        before, resume = parts(partial), os.path.isdir(killed)
        process = start(corpus, killed)
        try:
            process.wait(timeout=rng.uniform(1, 12))
        except subprocess.TimeoutExpired:
            workers = children(process.pid)  # tokenizing workers, multiprocessing's tracker
            process.send_signal(signal.SIGKILL)
            process.wait()
            tally["kills"] += 1
            tally["moments"][moment(killed)] += 1
            tally["workers"] += len(workers)
            tally["orphans"] += len(still_running(workers, seconds=15))
        stderr = process.stderr.read()
        kept = all(parts(partial).get(p, t) == t for p, t in before.items())
        failed = process.returncode not in (0, -signal.SIGKILL) or "Traceback" in stderr
        if failed:
            tally["errors"].append(stderr.strip().splitlines()[-1:])
        tally["resumes"] += resume
        tally["clean"] += resume and not failed and "damaged" not in stderr and kept
        tally["damaged"] += damaged_files(killed, sizes)
        if process.returncode == 0:  # finished before its kill: compare, start afresh
            tally["finished"] += 1
            tally["unequal"] += outputs(killed) != reference or bool(leftovers(killed))
            shutil.rmtree(killed)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=1_000_000)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        corpus = write_corpus(os.path.join(scratch, "corpus"), args.pairs)
        straight = os.path.join(scratch, "straight")
        clean_start = time.perf_counter()
        assert start(corpus, straight).wait() == 0, "the run never killed failed"
        clean_s = time.perf_counter() - clean_start
        reference = outputs(straight)
        killed = os.path.join(scratch, "killed")
        tally = kill_rounds(args, corpus, killed, reference)
        final = start(corpus, killed)
        final_err = final.communicate()[1]
        if final.returncode != 0:
            tally["errors"].append(("final", final_err.strip().splitlines()[-1:]))
        same = outputs(killed) == reference and not leftovers(killed)
        print(f"{tally['kills']} kills, after each: {dict(sorted(tally['moments'].items()))}")
        print(f"{tally['kills']} kills; {tally['clean']} of {tally['resumes']} restarts after a "
              f"kill resumed cleanly (no error, no damaged file, the whole parts before kept); "
              f"files not whole after a kill: {len(tally['damaged'])} {tally['damaged'][:3]}; "
              f"failed starts: {tally['errors']}; {tally['finished']} preparations finished "
              f"between kills ({tally['unequal']} unequal to the reference); final exit "
              f"{final.returncode}; tokenizer and prepared ids equal, byte for byte, to those "
              f"of the run never killed ({clean_s:.0f} s): {same}; "
              f"{time.perf_counter() - started:.0f} s in all; child processes (tokenizing "
              f"workers, multiprocessing's resource tracker) at the kills: "
              f"{tally['workers']}, of which still running 15 s after: {tally['orphans']}")
        return 0 if same and not tally["errors"] and not tally["damaged"] and not tally[
            "unequal"] and not tally["orphans"] and tally["clean"] == tally["resumes"] else 1


if __name__ == "__main__":
    sys.exit(main())
