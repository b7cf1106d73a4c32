"""Where a suite's time goes: JAX profiler traces, summed per kind of XLA operation.

    python -m transformer_jax.benchmark model --profile=runs/profile

traces every timed call (not the warm-up, so no compilation; open the traces in
Perfetto or TensorBoard's profiler) and prints the operations that took the
most time, grouped by fusion kind: on CPUs "ynn_fusion" is a matmul run by
YNNPACK, "copy_bitcast_fusion" and "transpose_copy_fusion" move data into
another layout, "broadcast_add_fusion" and the like are elementwise, "while"
a loop. The times are summed over threads, so on a 2-core CPU they can add up
to about twice the wall time.
"""

import collections
import glob
import gzip
import json
import os
import re

# Events that are not XLA operations: the Python side and the runtime's own spans.
_NOT_OPS = re.compile(r"^\$|^end: |Thunk|Pjit|PjRt|block_until_ready|ThreadPool|ExecuteReplicated|"
                      r"ParseArguments|shard_args|ExecuteHelper")


def summarize(trace_dir: str, top: int = 15) -> list[dict]:
    """The `top` operation kinds by total time over every trace under `trace_dir`."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}")
    events = []
    for path in paths:
        with gzip.open(path) as f:
            events += json.load(f)["traceEvents"]
    micros, count = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("ph") == "X" and not _NOT_OPS.search(event["name"]):
            kind = re.sub(r"\.\d+$", "", event["name"])  # "ynn_fusion.12" -> "ynn_fusion"
            micros[kind] += event.get("dur", 0)
            count[kind] += 1
    total = sum(micros.values()) or 1
    return [{"operation": kind, "ms": us / 1e3, "share": us / total, "calls": count[kind]}
            for kind, us in micros.most_common(top)]
