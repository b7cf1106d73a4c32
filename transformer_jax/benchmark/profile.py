"""Where a suite's time goes: a JAX profiler trace, summed per kind of XLA operation.

    python -m transformer_jax.benchmark model --profile=runs/profile

writes a trace (open it in Perfetto or TensorBoard's profiler) and prints the
operations that took the most time, grouped by their fusion kind ("ynn_fusion"
is a matmul run by XNNPACK's successor YNNPACK on CPUs, "copy_bitcast_fusion"
a transpose, "broadcast_add_fusion" an elementwise op, ...). The times are
summed over threads, so on a 2-core CPU they add up to about twice the wall time.
"""

import collections
import glob
import gzip
import json
import os
import re

# Events that are not XLA operations: the Python side and the runtime's own spans.
_NOT_OPS = re.compile(r"^\$|Thunk|Pjit|PjRt|block_until_ready|ThreadPool|ExecuteReplicated|"
                      r"ParseArguments|shard_args|ExecuteHelper")


def summarize(trace_dir: str, top: int = 15) -> list[dict]:
    """The `top` operation kinds by total time in the newest trace under `trace_dir`."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}")
    with gzip.open(max(paths, key=os.path.getmtime)) as f:
        events = json.load(f)["traceEvents"]
    micros, count = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("ph") == "X" and not _NOT_OPS.search(event["name"]):
            kind = re.sub(r"\.\d+$", "", event["name"])  # "ynn_fusion.12" -> "ynn_fusion"
            micros[kind] += event.get("dur", 0)
            count[kind] += 1
    total = sum(micros.values()) or 1
    return [{"operation": kind, "ms": us / 1e3, "share": us / total, "calls": count[kind]}
            for kind, us in micros.most_common(top)]
