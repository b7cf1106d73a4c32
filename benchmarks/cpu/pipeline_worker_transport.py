"""Grain workers' batches by shared memory (grain's default, what `pipeline.in_workers`
uses) against copied through the workers' pipes (grain's `min_shm_size` of 1 MiB, used
before 2026-11-30), side by side in one process (BENCHMARKS.md, "pipeline: prepared ids to
batches"). Usage: python benchmarks/cpu/pipeline_worker_transport.py [--json FILE]

The numbers dataset's training split at 64 rows of 16 + 32 tokens, and a WMT-like corpus
of 60,000 pairs at 96 rows of 256 + 256, each at 1 and 2 workers; two rounds, the second
in the other order. Each figure reads 5-10 batches first (the workers start, their buffers
fill), then times 20-40 per worker. Also prints how long each close took and the workers'
exit statuses (-9: grain killed one after 25 s).
"""

import argparse
import json
import multiprocessing
import tempfile
import time

import grain

from transformer_jax.benchmark import pipeline as bp
from transformer_jax.benchmark.corpus import write_wmt_like_corpus
from transformer_jax.data import pipeline
from transformer_jax.run_config import data_fields

COPIED = 1 << 20  # min_shm_size: the arrays under it are copied


def batches(split, case: bp.Case, transport: str):
    """An iterator of `case`'s packed batches from `case.workers` grain workers."""
    packed = pipeline.train_dataset(split, batch_size=case.rows, num_workers=0,
                                    max_source_length=case.source_length,
                                    max_target_length=case.target_length)
    if transport == "copied":
        packed = grain.experimental.WithOptionsIterDataset(
            packed, grain.experimental.DatasetOptions(min_shm_size=COPIED))
    return iter(pipeline.in_workers(packed, case.workers))


def measure(split, case: bp.Case, transport: str) -> dict:
    it = batches(split, case, transport)
    figures = bp.time_batches(it, 20 * (1 + case.workers), 5 * (1 + case.workers))
    workers = multiprocessing.active_children()
    start = time.perf_counter()
    it.close()
    return {"data": case.data, "rows": case.rows, "workers": case.workers,
            "transport": transport, "target_tokens_per_sec": figures["target_tokens_per_sec"],
            "close_s": time.perf_counter() - start,
            "exit_statuses": [w.exitcode for w in workers]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        splits = {"numbers": bp._prepare_train(data_fields(), f"{tmp}/numbers")}
        wmt = bp.wmt_data(write_wmt_like_corpus(f"{tmp}/wmt", 60_000), True)
        splits["wmt"] = bp._prepare_train(wmt, f"{tmp}/wmt-run")
        cases = [bp.Case("numbers", 64, 16, 32, w) for w in (1, 2)] + [
            bp.Case("wmt", 96, 256, 256, w) for w in (1, 2)]
        rows = []
        for order in (("copied", "shared"), ("shared", "copied")):
            for case in cases:
                for transport in order:
                    rows.append(measure(splits[case.data], case, transport))
                    r = rows[-1]
                    print(f"{r['data']:8s} {r['rows']} rows, {r['workers']} workers, "
                          f"{transport:6s}: {r['target_tokens_per_sec'] / 1e6:5.2f} M target "
                          f"tokens/s; close {r['close_s']:4.1f} s, exit {r['exit_statuses']}",
                          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
