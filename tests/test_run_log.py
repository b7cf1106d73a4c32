"""RunLog: metrics.jsonl, TensorBoard event files and curves.png, written without loading
torch, and without matplotlib until there is something to draw."""

import errno
import importlib.util
import io
import json
import os
import re
import struct
import subprocess
import sys

import pytest
from tensorboardX.proto import event_pb2

from run_configs import ROOT
from test_plot import png_size
from transformer_jax import plot
from transformer_jax.run_log import MetricsWriteError, RunLog, drop_records_after


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


def test_a_run_ending_on_an_evaluation_draws_it_once(tmp_path):
    """close() redraws only when records came after the last drawing: the picture written
    at the last evaluation is the file left (curves.png is replaced whole, so a redrawing
    would be another file)."""
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    log.write(4, {"loss": 1.0, "learning_rate": 0.5})
    log.write(4, {"eval_loss": 0.75})
    drawn = (tmp_path / "curves.png").stat().st_ino
    log.close()
    assert (tmp_path / "curves.png").stat().st_ino == drawn
    resumed = RunLog(str(tmp_path), total_steps=6, first_step=4)  # records of its own: drawn
    resumed.write(6, {"loss": 0.5, "learning_rate": 0.5})
    resumed.close()
    assert (tmp_path / "curves.png").stat().st_ino != drawn


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


def test_a_drawing_failure_is_reported_in_its_first_line(tmp_path, capsys, monkeypatch):
    """An error of several lines (matplotlib's) is one warning, with its first line."""
    def fail(path, runs):
        raise ValueError("cannot draw\n  a second line of detail")

    monkeypatch.setattr(plot, "write_curves", fail)
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    log.write(2, {"eval_loss": 0.75})
    log.close()
    assert capsys.readouterr().out == (f"warning: {tmp_path / 'curves.png'} not drawn "
                                       f"(ValueError: cannot draw); training goes on\n")


def test_any_evaluation_record_draws_the_curves_a_bleu_record_too(tmp_path, monkeypatch):
    """BLEU is measured on its own schedule: a record of eval_bleu and eval_chrf alone is
    an evaluation's, and redraws curves.png with every record so far."""
    drawn = []
    monkeypatch.setattr(plot, "write_curves",
                        lambda path, runs: drawn.append([r["step"] for r in runs[0][1]]))
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    log.write(2, {"loss": 1.5, "learning_rate": 0.25})
    assert drawn == []
    log.write(2, {"eval_bleu": 12.5, "eval_chrf": 40.0})
    assert drawn == [[2, 2]]
    log.close()
    assert drawn == [[2, 2]]  # nothing logged since


def test_the_clock_goes_on_from_the_last_record_kept_at_a_resume(tmp_path):
    write(tmp_path, "".join(json.dumps({"step": s, "loss": 1.0, "elapsed_s": t}) + "\n"
                            for s, t in ((2, 10.0), (4, 20.0), (6, 30.0))))
    log = RunLog(str(tmp_path), total_steps=8, first_step=4)  # step 6 was not saved
    log.write(6, {"loss": 0.5})
    log.close()
    records = read(tmp_path)
    assert [(r["step"], r["loss"]) for r in records] == [(2, 1.0), (4, 1.0), (6, 0.5)]
    assert 20.0 <= records[-1]["elapsed_s"] < 20.0 + 60


def test_the_clock_goes_on_from_the_last_record_kept_not_a_dropped_one(tmp_path):
    """Resumed at step 4: the records of steps 2 and 4 are kept (and returned, for the
    clock and the curves), step 6's (at 100 s) goes; the next record's clock starts from
    step 4's 20.25 s, kept to the millisecond, not from 100 s nor rounded to 20 s."""
    write(tmp_path, "".join(json.dumps({"step": s, "loss": 1.0, "elapsed_s": t}) + "\n"
                            for s, t in ((2, 10.5), (4, 20.25), (6, 100.0))))
    assert drop_records_after(str(tmp_path / "metrics.jsonl"), 4) == [
        {"step": 2, "loss": 1.0, "elapsed_s": 10.5}, {"step": 4, "loss": 1.0, "elapsed_s": 20.25}]
    log = RunLog(str(tmp_path), total_steps=8, first_step=4)
    log.write(6, {"loss": 0.5})
    log.close()
    assert 20.25 <= read(tmp_path)[-1]["elapsed_s"] < 100.0


def test_the_bars_rate_and_time_left_count_from_the_first_step_done(tmp_path):
    """A resumed run at step 100 of 300: its first step compiles for 12 s, then 20 steps take
    2 s. The bar says 10 steps/s and 17.9 s left (179 steps), not the 21 steps over 14 s
    (1.5 steps/s, 119 s left) it said with the compilation counted."""
    log = RunLog(str(tmp_path), total_steps=300, first_step=100)
    bar, clock = log._progress, [1000.0]
    bar._time = lambda: clock[0]  # tqdm's clock, as it reads it
    bar.start_t = bar.last_print_t = clock[0]
    clock[0] += 12.0
    log.first_step_done(101)
    clock[0] += 2.0
    log.progress(121, {"loss": 2.0, "learning_rate": 1e-3})
    shown = bar.format_dict
    log.close()
    assert (shown["n"], shown["elapsed"]) == (121, 2.0)
    assert shown["rate"] == pytest.approx(10.0)
    assert (shown["total"] - shown["n"]) / shown["rate"] == pytest.approx(17.9)


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


FULL_DISK = """
import resource, signal, sys, time
from transformer_jax.run_log import MetricsWriteError, RunLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails as on a full disk
workdir, first_step, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0  # for tensorboardX's writer thread
log = RunLog(workdir, total_steps=1000, first_step=first_step)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    for step in range(first_step + 1, 1000):
        log.write(step, {"loss": 1.5, "learning_rate": 0.25})
        time.sleep(pause)
except MetricsWriteError as error:
    print(f"error: {error}", file=sys.stderr)
finally:
    log.close()
"""


def printed_lines(stderr: str) -> list[str]:
    """The lines of `stderr` without tqdm's progress bar (redrawn after a carriage return,
    and not ended where a message follows it)."""
    stderr = re.sub(r"train: [^\r\n]*?step/s\]", "", stderr)
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]


def test_a_full_disk_stops_the_log_in_one_line_and_the_torn_record_goes_at_a_resume(
        tmp_path, capsys):
    """Files limited to 20 bytes more than metrics.jsonl holds (the records of steps 1-60):
    writing step 61's record fails with EFBIG ("File too large"), as on a full disk, after
    20 of its bytes. One line names the file, the step and the OS error; none of
    tensorboardX's tracebacks (its writer thread, its exit hook) follow. A resume drops
    the torn record with a warning."""
    kept = "".join(json.dumps({"step": step, "loss": 1.0}) + "\n" for step in range(1, 61))
    write(tmp_path, kept)
    limit = len(kept) + 20
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path), "60", str(limit)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert printed_lines(done.stderr) == [
        f"error: {tmp_path / 'metrics.jsonl'}: the record of step 61 could not be written: "
        f"File too large (OS error 27); training stopped, and the same command resumes from "
        f"the newest checkpoint"]
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text[:len(kept)] == kept and text[len(kept):] == '{"step": 61, "loss":'
    RunLog(str(tmp_path), total_steps=100, first_step=60).close()
    assert (tmp_path / "metrics.jsonl").read_text() == kept
    assert "metrics.jsonl: skipped its half-written last line" in capsys.readouterr().err


def test_a_full_disk_for_the_tensorboard_events_is_one_line_too(tmp_path):
    """Files limited to 3,000 bytes in a new workdir: the event file (about 100 bytes a
    record) reaches it about 15 records before metrics.jsonl (66 bytes a record): one line
    names the events and the step, and metrics.jsonl holds every record up to that step."""
    # tensorboardX's threads write the events: a pause after each record lets them keep up
    # (on a loaded machine they could lag until metrics.jsonl fails first).
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path), "0", "3000", "0.1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    (line,) = printed_lines(done.stderr)
    assert line.startswith(
        f"error: the TensorBoard events in {tmp_path}: the record of step "), line
    assert line.endswith(" could not be written: File too large (OS error 27); training "
                         "stopped, and the same command resumes from the newest checkpoint")
    step = int(line.split("step ")[1].split(" ")[0])
    assert [r["step"] for r in read(tmp_path)] == list(range(1, step + 1))


def test_the_bar_shows_no_rate_until_a_step_after_the_first_is_done(tmp_path):
    """Half a second after the first step (which compiled) is done, no step of the rate's
    has run: the bar shows "?step/s", not 1 step over those 0.5 s (2 steps/s and 1:39 left
    of 300)."""
    log = RunLog(str(tmp_path), total_steps=300, first_step=100)
    bar, clock = log._progress, [1000.0]
    bar._time = lambda: clock[0]
    bar.start_t = bar.last_print_t = clock[0]
    clock[0] += 12.0
    log.first_step_done(101)
    clock[0] += 0.5
    shown = str(bar)
    log.close()
    assert shown.endswith("| 101/300 [00:00<?, ?step/s]"), shown


def test_a_run_with_no_step_left_shows_no_bar(tmp_path, capsys):
    """Resumed at its last step (4 of 4): nothing to train, and no bar; one step left
    shows one."""
    RunLog(str(tmp_path), total_steps=4, first_step=4).close()
    assert capsys.readouterr().err == ""
    RunLog(str(tmp_path), total_steps=4, first_step=3).close()
    assert "train:  75%" in capsys.readouterr().err


def test_a_message_is_printed_above_the_bar(tmp_path, capsys):
    """A message is a line on stdout, with the bar (on stderr) cleared before it and drawn
    again after it, not a line printed over the bar."""
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    capsys.readouterr()
    log.message("step 2: eval_loss 0.75")
    printed = capsys.readouterr()
    log.close()
    assert printed.out == "step 2: eval_loss 0.75\n"
    assert "train:   0%" in printed.err, printed.err


def test_the_log_of_a_process_other_than_the_first_writes_nothing(tmp_path):
    """Only process 0 writes: the others' RunLog takes records, messages and the bar's
    moves and makes no file at all."""
    log = RunLog(str(tmp_path), total_steps=4, first_step=0, enabled=False)
    log.first_step_done(1)
    log.write(2, {"loss": 1.5, "learning_rate": 0.25})
    log.write(2, {"eval_loss": 0.75})
    log.progress(2, {"loss": 1.5, "learning_rate": 0.25})
    log.message("a line")
    log.draw()
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_a_metrics_file_that_cannot_be_opened_is_one_metrics_write_error(tmp_path):
    """A folder where metrics.jsonl should be: one MetricsWriteError naming the file,
    before any record."""
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(MetricsWriteError, match=(
            f"^{re.escape(str(tmp_path / 'metrics.jsonl'))}: its records could not be written: "
            r"Is a directory \(OS error 21\); training stopped")):
        RunLog(str(tmp_path), total_steps=4, first_step=0)


def test_an_os_error_without_its_own_reason_and_a_record_of_step_0_are_named(tmp_path):
    """An OSError raised with a message alone (no errno) gives that message, not "None (OS
    error None)"; a record of step 0 is named as such, not as "its records"."""
    assert str(MetricsWriteError("W/metrics.jsonl", 0, OSError("the writer is closed"))) == (
        "W/metrics.jsonl: the record of step 0 could not be written: the writer is closed; "
        "training stopped, and the same command resumes from the newest checkpoint")


class FullDisk(io.StringIO):
    """metrics.jsonl on a full disk: what is written stays in the buffer, and flushing it
    fails."""

    def flush(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_after_a_failed_write_closing_draws_nothing(tmp_path, monkeypatch):
    """A record that cannot be written is one MetricsWriteError, and the log's close (in
    the training loop's `finally`) raises nothing and draws no curves.png."""
    drawn = []
    monkeypatch.setattr(plot, "write_curves", lambda path, runs: drawn.append(path))
    log = RunLog(str(tmp_path), total_steps=4, first_step=0)
    log.write(2, {"loss": 1.5, "learning_rate": 0.25})
    log._jsonl = FullDisk()
    with pytest.raises(MetricsWriteError, match=(
            r"metrics\.jsonl: the record of step 4 could not be written: No space left on "
            r"device \(OS error 28\)")):
        log.write(4, {"loss": 1.0, "learning_rate": 0.25})
    log.close()
    assert drawn == []
