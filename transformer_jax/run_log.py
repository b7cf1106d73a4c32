"""Where a run's metrics go: DIR/metrics.jsonl, TensorBoard event files, DIR/curves.png,
a progress bar.

Only process 0 writes; the others get a RunLog that does nothing. On resume,
metrics.jsonl loses the records past the restored step (they are logged again).

Each record carries `elapsed_s`, the run's wall time: seconds since this RunLog opened
(just before the first step, so the first record includes compiling; evaluation counts),
plus, on resume, the `elapsed_s` of the last record kept. The time of steps done again
after a resume, and between a stop and the restart, is not counted.

A record that cannot be written (a full disk: ENOSPC) stops training with one
MetricsWriteError naming the file and the OS error, rather than going on with a gap in
the metrics; the checkpoints already written are kept. A record left half-written is
dropped, with a warning, when the run resumes. curves.png is only a picture: failing to
draw it is one warning, and training goes on.
"""

import contextlib
import json
import os
import sys
import time
import warnings

import tqdm

from transformer_jax import plot  # cheap: matplotlib is imported only to draw
from transformer_jax.atomic_file import atomic_write


class MetricsWriteError(Exception):
    """metrics.jsonl or the TensorBoard events could not be written (a full disk, a folder
    that became unwritable): training stops, in one line."""

    def __init__(self, what: str, step: int | None, error: OSError):
        reason = f"{error.strerror} (OS error {error.errno})" if error.strerror else str(error)
        when = f"the record of step {step}" if step is not None else "its records"
        super().__init__(f"{what}: {when} could not be written: {reason}; training stopped, "
                         f"and the same command resumes from the newest checkpoint")


class RunLog:
    """Appends one JSON object per record to metrics.jsonl, mirrors it to TensorBoard, and
    draws curves.png at each evaluation and at the end."""

    def __init__(self, workdir: str, *, total_steps: int, first_step: int, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        path = self._path = os.path.join(workdir, plot.METRICS)
        self._workdir = workdir
        try:
            self._records = drop_records_after(path, first_step)
            self._jsonl = open(path, "a", encoding="utf-8")
        except OSError as error:
            raise MetricsWriteError(path, None, error) from None
        self._clock_offset = next((r[plot.ELAPSED] for r in reversed(self._records)
                                   if plot.ELAPSED in r), 0.0)
        self._clock_start = time.monotonic()
        self._curves = os.path.join(workdir, plot.CURVES)
        self._name = os.path.basename(os.path.normpath(os.path.abspath(workdir)))
        self._written = self._drawing_failed = self._failed = False
        self._drawn = 0  # how many records curves.png holds
        self._tensorboard = _summary_writer(workdir)
        self._progress = tqdm.tqdm(total=total_steps, initial=first_step, unit="step",
                                   dynamic_ncols=True, desc="train",
                                   disable=first_step >= total_steps)  # nothing to train

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """One record: `metrics` at `step` (train and eval records carry their own keys),
        and the run's wall time. An evaluation's record redraws curves.png."""
        if not self.enabled:
            return
        elapsed = self._clock_offset + time.monotonic() - self._clock_start
        record = {"step": step, **metrics, plot.ELAPSED: round(elapsed, 3)}
        with self._failing_as(self._path, step):
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        self._records.append(record)
        self._written = True
        with self._failing_as(f"the TensorBoard events in {self._workdir}", step):
            for name, value in metrics.items():  # TensorBoard keeps its own wall time
                group = "eval" if name.startswith("eval_") else "train"
                self._tensorboard.add_scalar(f"{group}/{name.removeprefix('eval_')}", value,
                                             step)
            self._tensorboard.flush()
        if any(name.startswith("eval_") for name in metrics):
            self.draw()

    def draw(self) -> None:
        """Redraws curves.png from the records. Training goes on if drawing fails: the
        first failure is reported in one line, later ones are silent."""
        if not self.enabled:
            return
        self._drawn = len(self._records)
        try:
            with warnings.catch_warnings():  # nothing of matplotlib's over the progress bar
                warnings.simplefilter("ignore")
                plot.write_curves(self._curves, [(self._name, self._records)])
        except Exception as error:  # noqa: BLE001 -- a picture never stops a run
            if not self._drawing_failed:
                self._drawing_failed = True
                reason = (str(error).strip().splitlines() or [""])[0]
                self.message(f"warning: {self._curves} not drawn "
                             f"({type(error).__name__}: {reason}); training goes on")

    def first_step_done(self, step: int) -> None:
        """The bar at `step`, its clock restarted: its rate and time left count the steps
        from here, not the first step's compilation (as the records' rates leave it out;
        with it, the first estimate of a CPU run was twice the time it took)."""
        if not self.enabled:
            return
        bar = self._progress
        bar.n = bar.last_print_n = bar.initial = step  # no rate from the first step (initial:
        bar.unpause()  # tqdm's average until its first sample, 0 steps here, not 1 over 0 s)
        bar.refresh()

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        """Moves the bar to `step` and shows the latest loss, learning rate and speed."""
        if not self.enabled:
            return
        speed = {"tok_s": f"{metrics['tokens_per_sec']:,.0f}"} if "tokens_per_sec" in metrics \
            else {}  # a record of left-out steps alone (MetricsWindow) has no rates
        self._progress.set_postfix(
            loss=f"{metrics['loss']:.3f}", lr=f"{metrics['learning_rate']:.2e}", **speed,
            refresh=False)
        self._progress.update(step - self._progress.n)

    def message(self, text: str) -> None:
        """A line printed above the progress bar."""
        if self.enabled:
            self._progress.write(text)

    @contextlib.contextmanager
    def _failing_as(self, what: str, step: int):
        """An OSError inside as one MetricsWriteError naming `what` and `step`."""
        try:
            yield
        except OSError as error:
            self._failed = True
            raise MetricsWriteError(what, step, error) from None

    def close(self) -> None:
        """Draws curves.png a last time (if this run logged anything since the last drawing:
        a run that ends on an evaluation has drawn it; a drawing takes 0.5-0.7 s on a
        2-core CPU) and closes the files. After a failed write, closing raises nothing and
        draws nothing."""
        if not self.enabled:
            return
        if self._written and not self._failed and len(self._records) > self._drawn:
            self.draw()
        self._progress.close()
        if not self._failed:
            self._tensorboard.close()
            self._jsonl.close()
            return
        with contextlib.suppress(OSError):
            self._jsonl.close()  # a failed flush still closes the file
        _abandon(self._tensorboard)


def _summary_writer(workdir: str):
    """tensorboardX's SummaryWriter: TensorBoard event files without TensorFlow.
    tensorboardX imports torch whenever it is installed, only to recognise torch tensors,
    which this log never passes (1.7 s and 180 MB more in a JAX run, on a 2-core CPU):
    it is imported with torch hidden (`import torch` fails), unless torch is loaded already."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter(workdir)


def _abandon(writer) -> None:
    """Ends a tensorboardX SummaryWriter whose event file cannot be written, quietly. Its
    own `close` flushes first and, failing, leaves its writer thread running and its exit
    hook flushing again, each printing a traceback; tensorboardX has no public way out."""
    for file_writer in (writer.all_writers or {}).values():
        events = file_writer.event_writer
        events._closed = True  # noqa: SLF001 -- the exit hook's close() does nothing
        if events._worker is not None and events._worker.is_alive():  # noqa: SLF001
            events._worker.stop()  # noqa: SLF001


def drop_records_after(path: str, step: int) -> list[dict]:
    """Removes the records of steps after `step` from a metrics.jsonl, if any, and
    returns the records kept.

    A run killed after logging step N but before its checkpoint resumes from an
    earlier step and logs those steps again; without this they would be there twice.
    A half-written last line (killed while writing it) goes too, with a warning:
    the next record would be glued to it.
    """
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    records = plot.parse_records(text, path)
    kept = [r for r in records if r["step"] <= step]
    if not text or (len(kept) == len(records) and text.endswith("\n")):
        return kept
    # Whole or not at all: a crash or a full disk leaves the old file, never a part.
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)  # as `write` wrote them
    return kept
