"""RunLog: metrics.jsonl and TensorBoard event files, written without loading torch."""

import importlib.util
import json
import os
import struct
import subprocess
import sys

from tensorboardX.proto import event_pb2

from run_configs import ROOT
from transformer_jax.run_log import RunLog


def event_scalars(workdir) -> list[tuple[str, int, float]]:
    """(tag, step, value) of each scalar in the event files, read as TFRecords: a u64
    length, its CRC (4 bytes), the Event proto, its CRC (4 bytes)."""
    scalars = []
    for name in sorted(os.listdir(workdir)):
        if not name.startswith("events.out.tfevents"):
            continue
        data, at = (workdir / name).read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            scalars += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
            at += 12 + length + 4
    return scalars


def test_records_reach_metrics_jsonl_and_tensorboard(tmp_path):
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    log.write(2, {"loss": 1.5, "learning_rate": 0.25})
    log.write(4, {"eval_loss": 0.75})
    log.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 2, "loss": 1.5, "learning_rate": 0.25}, {"step": 4, "eval_loss": 0.75}]
    assert event_scalars(tmp_path) == [
        ("train/loss", 2, 1.5), ("train/learning_rate", 2, 0.25), ("eval/loss", 4, 0.75)]


def test_a_run_log_does_not_load_torch(tmp_path):
    """tensorboardX imports torch whenever it is installed (the dev extra installs it);
    a run's log hides it: a JAX run does not pay torch's import."""
    assert importlib.util.find_spec("torch") is not None
    script = ("import sys; from transformer_jax.run_log import RunLog; "
              f"RunLog({str(tmp_path)!r}, total_steps=1, first_step=0).close(); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
