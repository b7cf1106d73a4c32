"""Where a run's metrics go: DIR/metrics.jsonl, TensorBoard event files, a progress bar.

Only process 0 writes; the others get a RunLog that does nothing.
"""

import json
import os

import tqdm
from tensorboardX import SummaryWriter  # event files without TensorFlow


class RunLog:
    """Appends one JSON object per record to metrics.jsonl and mirrors it to TensorBoard."""

    def __init__(self, workdir: str, *, total_steps: int, first_step: int, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
        self._tensorboard = SummaryWriter(workdir)
        self._progress = tqdm.tqdm(total=total_steps, initial=first_step, unit="step",
                                   dynamic_ncols=True, desc="train")

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """One record: `metrics` at `step` (train and eval records carry their own keys)."""
        if not self.enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self._jsonl.flush()
        for name, value in metrics.items():
            group = "eval" if name.startswith("eval_") else "train"
            self._tensorboard.add_scalar(f"{group}/{name.removeprefix('eval_')}", value, step)
        self._tensorboard.flush()

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        """Moves the bar to `step` and shows the latest loss, learning rate and speed."""
        if not self.enabled:
            return
        self._progress.set_postfix(
            loss=f"{metrics['loss']:.3f}", lr=f"{metrics['learning_rate']:.2e}",
            tok_s=f"{metrics['tokens_per_sec']:,.0f}", refresh=False)
        self._progress.update(step - self._progress.n)

    def message(self, text: str) -> None:
        """A line printed above the progress bar."""
        if self.enabled:
            self._progress.write(text)

    def close(self) -> None:
        if self.enabled:
            self._progress.close()
            self._tensorboard.close()
            self._jsonl.close()
