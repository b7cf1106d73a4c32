"""RunLog: metrics.jsonl, TensorBoard event files and curves.png, written without loading
torch, and without matplotlib until there is something to draw."""

import importlib.util
import json
import os
import struct
import subprocess
import sys

from tensorboardX.proto import event_pb2

from run_configs import ROOT
from test_plot import png_size
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
    records = read(tmp_path)
    elapsed = [r.pop("elapsed_s") for r in records]
    assert records == [
        {"step": 2, "loss": 1.5, "learning_rate": 0.25}, {"step": 4, "eval_loss": 0.75}]
    assert 0 <= elapsed[0] <= elapsed[1] < 60
    assert event_scalars(tmp_path) == [  # TensorBoard keeps its own wall time
        ("train/loss", 2, 1.5), ("train/learning_rate", 2, 0.25), ("eval/loss", 4, 0.75)]


def read(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def write(workdir, text: str) -> None:
    (workdir / "metrics.jsonl").write_text(text)


def test_an_evaluation_draws_curves_png_and_so_does_the_end(tmp_path):
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    log.write(2, {"loss": 1.5, "learning_rate": 0.25})
    assert not (tmp_path / "curves.png").exists()
    log.write(2, {"eval_loss": 0.75})
    assert png_size(tmp_path / "curves.png") == (1000, 420)  # loss, learning rate
    at_evaluation = (tmp_path / "curves.png").read_bytes()
    log.write(4, {"loss": 1.0, "learning_rate": 0.5})
    assert (tmp_path / "curves.png").read_bytes() == at_evaluation  # a training record: no
    log.close()
    assert (tmp_path / "curves.png").read_bytes() != at_evaluation  # step 4 is drawn
    assert png_size(tmp_path / "curves.png") == (1000, 420)
    assert sorted(p.name for p in tmp_path.iterdir() if "tfevents" not in p.name) == [
        "curves.png", "metrics.jsonl"]


def test_a_drawing_failure_warns_once_and_the_run_goes_on(tmp_path, capsys):
    (tmp_path / "curves.png").mkdir()  # a folder where the picture would go
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    for step in (2, 4):
        log.write(step, {"loss": 1.5, "learning_rate": 0.25})
        log.write(step, {"eval_loss": 0.75})
    log.close()
    assert [r["step"] for r in read(tmp_path)] == [2, 2, 4, 4]
    warnings = [line for line in capsys.readouterr().out.splitlines() if "curves.png" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"warning: {tmp_path / 'curves.png'} not drawn (")
    assert warnings[0].endswith("); training goes on")
    assert sorted(p.name for p in tmp_path.iterdir() if "tfevents" not in p.name) == [
        "curves.png", "metrics.jsonl"]  # no temporary file left behind


def test_the_clock_goes_on_from_the_last_record_kept_at_a_resume(tmp_path):
    write(tmp_path, "".join(json.dumps({"step": s, "loss": 1.0, "elapsed_s": t}) + "\n"
                            for s, t in ((2, 10.0), (4, 20.0), (6, 30.0))))
    log = RunLog(str(tmp_path), total_steps=8, first_step=4)  # step 6 was not saved
    log.write(6, {"loss": 0.5})
    log.close()
    records = read(tmp_path)
    assert [(r["step"], r["loss"]) for r in records] == [(2, 1.0), (4, 1.0), (6, 0.5)]
    assert 20.0 <= records[-1]["elapsed_s"] < 20.0 + 60


def test_a_half_written_last_line_goes_at_a_resume(tmp_path, capsys):
    """A run killed while writing a record: resuming drops the torn line (with a warning)
    rather than failing on it or gluing the next record to it."""
    write(tmp_path, json.dumps({"step": 2, "loss": 1.0}) + "\n" + '{"step": 4, "lo')
    log = RunLog(str(tmp_path), total_steps=4, first_step=2)
    log.write(4, {"loss": 0.5})
    log.close()
    assert [(r["step"], r["loss"]) for r in read(tmp_path)] == [(2, 1.0), (4, 0.5)]
    assert "skipped its half-written last line" in capsys.readouterr().err


def test_a_run_log_does_not_load_torch_nor_matplotlib(tmp_path):
    """tensorboardX imports torch whenever it is installed (the dev extra installs it);
    a run's log hides it: a JAX run does not pay torch's import. matplotlib waits for the
    first picture (train.py's start-up is 2.2 s)."""
    assert importlib.util.find_spec("torch") is not None
    script = ("import sys; from transformer_jax.run_log import RunLog; "
              f"RunLog({str(tmp_path)!r}, total_steps=1, first_step=0).close(); "
              "print(sorted(m for m in sys.modules "
              "if m.split('.')[0] in ('torch', 'matplotlib')))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
