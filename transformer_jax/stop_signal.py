"""SIGTERM and Ctrl-C during training: save after the current step, or stop at once.

    with StopSignal() as stop:      # from before the data is read, while the step compiles
        ...
        stop.training = True        # the first signal from here on asks for a save
        if stop.requested: save and return
        stop.check()                # at every step: raises a stop Python dropped
        stop.closing = True         # the loop ended: the first signal waits for the last save

Kept apart from the loop (trainer.py), which only reads `requested`, `agreed()` and
`check()`; train.py turns `StoppedAtOnce` into one line and exit status 1.
"""

import _thread
import os
import signal
import sys
import threading

import tqdm


def stopped_at_once(signum: int, *, again: bool = False) -> str:
    """What a stop at once says: before the first step, or a second signal (`again`)."""
    when = "a second time" if again else "before the first step"
    return (f"{signal.Signals(signum).name} {when}: stopped at once; nothing saved since the "
            f"last checkpoint: a restart resumes from it (or starts afresh if none was written "
            f"yet)")


def stop_while_starting(signum, frame) -> None:
    """A handler for SIGTERM and Ctrl-C while a run starts, before `StopSignal` takes over
    (train.py sets it first): one line and exit status 1, wherever Python is. Python's
    KeyboardInterrupt printed a traceback from inside an import, or was dropped inside
    JAX's garbage-collector callback while the run trained on; SIGTERM ended it without a
    word."""
    del frame
    os.write(2, f"error: {stopped_at_once(signum)}\n".encode())
    os._exit(1)


class StoppedAtOnce(BaseException):
    """A stop signal before training started, or a second one: the run ended unsaved. A
    BaseException, as KeyboardInterrupt is, so that no `except Exception` it passes through
    (the checkpoint reader's, which moves damaged steps aside) takes it for a failure."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class StopSignal:
    """SIGTERM and Ctrl-C. Once training runs, the first sets a flag: the loop finishes the
    current step, saves and stops (once the loop has ended, `closing`: the last save is
    finished first). One before the first step (data, tokenizer, compiling),
    or a second one (a save or a data wait taking too long), stops at once: StoppedAtOnce,
    nothing saved, and a restart resumes from the last checkpoint."""

    def __init__(self):
        self.requested = self.training = self.closing = False
        self.stopped: StoppedAtOnce | None = None
        self._previous = {s: signal.signal(s, self._handle)
                          for s in (signal.SIGTERM, signal.SIGINT)}
        self._previous_unraisable, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def _handle(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        if self.closing and not self.requested:  # training ended: its last save is written
            self.requested = True
            tqdm.tqdm.write(f"{name}: the run is ending, once its last checkpoint is written "
                            f"(send it again to stop at once)", file=sys.stderr)
            return
        if self.training and not self.requested:
            self.requested = True
            # Above the progress bar, not on its line (tqdm's lock is re-entrant: the handler
            # may interrupt a redraw in this thread).
            tqdm.tqdm.write(f"{name}: saving after the current step (send it again to stop "
                            f"at once)", file=sys.stderr)
            return
        self.stopped = StoppedAtOnce(stopped_at_once(signum, again=self.requested), signum)
        raise self.stopped

    def _unraisable(self, unraisable):
        """The handler runs wherever Python is, and Python drops (and prints) an error raised
        where it cannot propagate: in a garbage-collector callback such as jax's, or a
        `__del__`. A stop dropped there is sent again 10 ms later (to this handler, or to
        none once restored), to be raised in the run's own code; `check` raises it before
        the first step and at every step in any case."""
        if unraisable.exc_value is not None and unraisable.exc_value is self.stopped:
            threading.Timer(0.01, _thread.interrupt_main, (self.stopped.signum,)).start()
        else:
            self._previous_unraisable(unraisable)

    def check(self) -> None:
        """Raises a stop that a signal raised where Python dropped it."""
        if self.stopped is not None:
            raise self.stopped

    def agreed(self) -> bool:
        """True if any process was asked to stop (all must save together)."""
        import jax  # here: train.py reads `stopped_at_once` before JAX loads
        import numpy as np
        from jax.experimental import multihost_utils

        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.array(self.requested)).any())

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        # Only if still ours: a hook set since (checkpoint.py's, which filters the noise of
        # a failed read still to come) calls ours, which calls the previous one.
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._previous_unraisable

    def __enter__(self) -> "StopSignal":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        """Restores the handlers. A stop is raised wherever Python is, and the code it
        interrupts may wrap it on the way out (Python 3.11 wraps an error in `__set_name__`
        in a RuntimeError) or fail from it: once a stop was raised, the run ends as it."""
        self.restore()
        if self.stopped is not None and error is not None and error is not self.stopped:
            raise self.stopped from None
