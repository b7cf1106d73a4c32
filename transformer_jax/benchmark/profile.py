"""Where a suite's time goes: JAX profiler traces, summed per kind of XLA operation.

    python -m transformer_jax.benchmark model --profile=runs/profile

traces every timed call (not the warm-up, so no compilation; open the traces in
Perfetto or TensorBoard's profiler) and prints the operations that took the
most time, grouped by fusion kind: on CPUs "ynn_fusion" is a matmul run by
YNNPACK, "copy_bitcast_fusion" and "transpose_copy_fusion" move data into
another layout, "broadcast_add_fusion" and the like are elementwise, "while"
a loop. The times are summed over threads, so on a 2-core CPU they can add up
to about twice the wall time. On a GPU the kernels are summed instead, by name
("gemm_fusion_dot", "nvjet_*" for cuBLAS, "cudnn_*" for attention, "input_*_fusion"
and "loop_*_fusion" for XLA's own): device time.
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
    """The `top` operation kinds by total time over every trace under `trace_dir`.

    With a GPU in the trace, only the GPU's own events count (its kernels, by
    name: device time, not the host's); otherwise every host thread's XLA ops.
    """
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}")
    events = []
    for path in paths:
        with gzip.open(path) as f:
            events += json.load(f)["traceEvents"]
    gpus = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and "GPU" in str(e.get("args", {}).get("name", ""))}
    micros, count = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("ph") != "X" or (event["pid"] not in gpus if gpus
                                      else _NOT_OPS.search(event["name"])):
            continue
        kind = re.sub(r"[._]\d+$", "", event["name"])[:100]  # "ynn_fusion.12" -> "ynn_fusion"
        micros[kind] += event.get("dur", 0)
        count[kind] += 1
    total = sum(micros.values()) or 1
    return [{"operation": kind, "ms": us / 1e3, "share": us / total, "calls": count[kind]}
            for kind, us in micros.most_common(top)]
