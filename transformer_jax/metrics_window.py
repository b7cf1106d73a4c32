"""The training metrics between two records of train.py: the steps' device values, fetched
to the host once, then their means and rates (what `metrics.jsonl` and the progress bar show).

    window = MetricsWindow()
    window.pending.append(metrics)    # each step's device values, as dispatched
    window.fetch(parallel, step)      # to the host, once; raises on a non-finite loss
    record = window.summary()         # loss, accuracy, ..., tokens_per_sec, steps_per_sec

The rates leave out the steps between `pause` and `resume`: a run's first step, which waits
for compiling, and profiled steps; and the time of work between steps (`left_out`).
"""

import contextlib
import math
import time
from collections.abc import Callable

import jax

from transformer_jax.parallel import Parallel


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; nothing was saved for that step."""


class MetricsWindow:
    """The training metrics since the last record: the steps' device values until
    `fetch` brings them to the host, once each, then their host values. Its rates leave
    out the steps (and their time) between `pause` and `resume`: a run's first step,
    which waits for compiling, and traced steps; the loss and accuracy count every step."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.pending, self.rows, self._clock, self._paused = [], [], clock, None
        self.start()

    def start(self) -> None:
        """Opens a new window (after a record, an evaluation, a save); a pause goes on."""
        self.opened, self._left_out, self._left_out_seconds = self._clock(), set(), 0.0
        if self._paused is not None:
            self._paused = (self.opened, 0)

    def pause(self) -> None:
        """The steps added from here to `resume` leave the rates (no-op if paused). Waits
        for the pending steps: dispatch runs ahead of the device, and their time is timed.
        (`resume` and `summary` come after a wait: the left-out step's, or `fetch`.)"""
        if self._paused is None:
            jax.block_until_ready(self.pending)
            self._paused = (self._clock(), len(self.rows) + len(self.pending))

    def resume(self) -> None:
        if self._paused is not None:
            since, first = self._paused
            self._left_out_seconds += self._clock() - since
            self._left_out.update(range(first, len(self.rows) + len(self.pending)))
            self._paused = None

    @contextlib.contextmanager
    def left_out(self):
        """The time of the block is not training's: an evaluation, a BLEU search or a save
        between two records leaves the rates, as its steps' time would (a pause around the
        block goes on). A record written inside it opens the next window as it would."""
        if self._paused is not None:
            yield
            return
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def fetch(self, parallel: Parallel, step: int) -> None:
        """Host values of the pending steps (waits for them); raises on a non-finite loss."""
        rows = [parallel.to_host(m) for m in self.pending]
        for offset, row in enumerate(rows):
            if not math.isfinite(row["loss_sum"]):
                raise NonFiniteLossError(
                    f"the loss is {row['loss_sum']} at step {step - len(rows) + offset + 1}; "
                    f"stopped without saving it (try a lower learning_rate_scale or "
                    f"grad_clip_norm > 0)")
        self.pending, self.rows = [], self.rows + rows

    def summary(self) -> dict[str, float]:
        """The record of the fetched steps, which starts a new window: means, the last
        rate, and the rates of the steps not left out (none if every step was)."""
        paused = self._paused is not None
        self.resume()
        rows, seconds = self.rows, self._clock() - self.opened - self._left_out_seconds
        timed = [r for i, r in enumerate(rows) if i not in self._left_out]
        tokens = sum(r["weight_sum"] for r in rows)
        record = {
            "loss": sum(r["loss_sum"] for r in rows) / max(tokens, 1.0),
            "accuracy": sum(r["correct_sum"] for r in rows) / max(tokens, 1.0),
            "learning_rate": rows[-1]["learning_rate"],
            "grad_norm": rows[-1]["grad_norm"],
        }
        if timed:
            record["tokens_per_sec"] = sum(r["weight_sum"] for r in timed) / seconds
            record["steps_per_sec"] = len(timed) / seconds
        self.rows = []
        self.start()
        if paused:
            self.pause()
        return record
