"""One process of the multi-process tests: `python multihost_worker.py PID NPROC PORT OUT [MODE]`.

Joins a run of NPROC processes on localhost (4 CPU devices in all) and feeds its own
rows of three fixed global batches to the pure train step. MODE "compare" (the
default): three steps under each strategy, then (process 0) the final parameters
to OUT/{strategy}.npz. MODE "steps": pmap steps, one line each, until killed.
"""

import os
import sys

import jax

pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mode = sys.argv[5] if len(sys.argv) > 5 else "compare"
jax.config.update("jax_num_cpu_devices", 4 // nproc)  # before anything starts the backend

from transformer_jax import parallel, processes  # noqa: E402

if nproc > 1:
    processes.initialize_processes(f"localhost:{port}", nproc, pid)

import functools  # noqa: E402
import itertools  # noqa: E402

import numpy as np  # noqa: E402

from transformer_jax.model import Transformer  # noqa: E402
from transformer_jax.model_config import get_model_config  # noqa: E402
from transformer_jax.optim import make_optimizer  # noqa: E402
from transformer_jax.steps import train_step  # noqa: E402
from transformer_jax.train_state import create_train_state  # noqa: E402

ROWS, LENGTH = 8, 6
# Dropout on: every layout numbers the 4 devices alike, so each draws the same masks. One
# layer each side: depth changes nothing across processes, and it halves the compiles.
config = get_model_config("tiny", vocab_size=40, dropout_rate=0.1, num_layers=1)
model = Transformer(config)
# Adam's eps 1e-3: see tests/test_parallel.py (the key biases' gradient is rounding noise).
optimizer = make_optimizer(d_model=config.d_model, warmup_steps=5, eps=1e-3)
step_fn = functools.partial(train_step, model=model, seed=0, label_smoothing=0.1,
                            learning_rate_fn=optimizer.learning_rate_fn)
rng = np.random.default_rng(0)
batches = [{k: rng.integers(1, 40, (ROWS, LENGTH)).astype(np.int32) for k in ("inputs", "targets")}
           for _ in range(3)]
mine = slice(pid * ROWS // nproc, (pid + 1) * ROWS // nproc)
if mode == "steps":  # the test kills a process; the others' steps then fail
    p = parallel.Parallel("pmap")
    placed = p.put_state(create_train_state(model, optimizer.tx, jax.random.key(0)))
    step = p.compile_train_step(step_fn)
    for i in itertools.count(1):
        batch = {k: v[mine] for k, v in batches[i % 3].items()}
        placed, metrics = step(placed, p.put_batch(batch))
        p.to_host(metrics)
        print(f"process {pid} step {i}", flush=True)
for strategy in ("pmap", "sharded"):
    p = parallel.Parallel(strategy)
    assert len(jax.devices()) == 4 and p.num_local_devices == 4 // nproc
    placed = p.put_state(create_train_state(model, optimizer.tx, jax.random.key(0)))
    step = p.compile_train_step(step_fn)
    for batch in batches:
        placed, _ = step(placed, p.put_batch({k: v[mine] for k, v in batch.items()}))
    final = p.get_state(placed).params  # numpy, on the host
    if pid == 0:
        leaves = jax.tree_util.tree_leaves_with_path(final)
        np.savez(os.path.join(out, f"{strategy}.npz"),
                 **{jax.tree_util.keystr(path): leaf for path, leaf in leaves})
# Leaving through the interpreter's exit runs JAX's distributed shutdown, a barrier of every
# process, as train.py leaves: none closes its connections while another still uses them.
# With os._exit after a barrier of our own, process 0 left and took the coordination service
# with it while process 1 still polled it (process 1 then aborted: "Socket closed"); before
# that barrier, while process 1 still read its part of the last all-reduce.
print(f"process {pid} done", flush=True)
