"""Several hosts: 2 processes x 2 CPU devices train like 1 process x 4 devices."""

import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(commands, cwd, env, timeout=300):
    """Starts the processes; kills them all if one fails or time runs out."""
    logs = [open(cwd / f"process_{i}.log", "w+") for i in range(len(commands))]
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True) for c, log in zip(commands, logs)]
    deadline = time.time() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = any(p.returncode not in (None, 0) for p in procs)
            if failed or time.time() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    return outputs


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return dict(env, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Final parameters of the same 3 updates: 2 processes, and 1 process."""
    results = {}
    for nproc in (2, 1):
        out = tmp_path_factory.mktemp(f"nproc{nproc}")
        port = free_port()
        launch([[sys.executable, str(HERE / "multihost_worker.py"), str(i), str(nproc),
                 str(port), str(out)] for i in range(nproc)], out, clean_env())
        results[nproc] = out
    return results


@pytest.mark.parametrize("strategy", ["pmap", "sharded"])
def test_two_processes_equal_one_process(runs, strategy):
    two, one = (np.load(runs[n] / f"{strategy}.npz") for n in (2, 1))
    assert sorted(two.files) == sorted(one.files) and len(one.files) > 10
    for name in one.files:
        np.testing.assert_allclose(two[name], one[name], atol=1e-5, rtol=1e-5, err_msg=name)


def test_train_py_with_two_processes(tmp_path):
    """train.py in 2 processes: both finish, process 0 alone logs, the checkpoint restores."""
    port = free_port()
    workdir = tmp_path / "run"
    command = [sys.executable, "train.py", "--config=configs/default.py", f"--workdir={workdir}",
               "--config.model.d_model=32", "--config.model.d_ff=64",
               "--config.model.num_layers=1", "--config.data.numbers_size=small",
               "--config.per_device_batch_size=2",
               "--config.num_train_steps=4", "--config.log_every_steps=2",
               "--config.eval_every_steps=4", "--config.num_eval_batches=1",
               f"--coordinator_address=localhost:{port}", "--num_processes=2"]
    env = clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=2",
                    TFDS_DATA_DIR=str(tmp_path / "tfds"))
    launch([command + [f"--process_id={i}"] for i in range(2)], tmp_path, env)
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    # Step 4: the training record, the evaluation and BLEU (due at the last step).
    assert [line.split(",")[0] for line in lines] == ['{"step": 2'] + ['{"step": 4'] * 3
    from transformer_jax.checkpoint import Checkpointer

    checkpointer = Checkpointer(str(workdir / "checkpoints"), keep=1)
    assert checkpointer.all_steps() == [4]
    assert checkpointer.metadata(4)["model"]["d_model"] == 32
    checkpointer.close()
    # Each process saved its own data-iterator position (grain's item), and they differ:
    # each packed its own share of the pairs.
    saved = sorted((workdir / "checkpoints" / "4" / "data_iterator").glob("process_*"))
    assert [f.name for f in saved] == ["process_0-of-2.json", "process_1-of-2.json"]
    assert saved[0].read_text() != saved[1].read_text()
