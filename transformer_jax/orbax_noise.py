"""Quiet failures of orbax: one error a user reads, not orbax's dozens of tracebacks.

When one array of a checkpoint fails to read or write, orbax raises at once while its
other reads and writes are still in flight; those fail later, in threads, coroutines and
log records, each printing a traceback. While any Checkpointer is open (`QuietOrbax`),
Python's hooks and the absl and asyncio loggers drop that noise and pass on all else;
`settled_on_failure` lets it end while it is still dropped; `error_line` makes one line
of an error whose message ends with pages of TensorStore's JSON.
"""

import contextlib
import gc
import logging
import os
import re
import sys
import threading
import time
import warnings


def is_orbax_noise(error: BaseException | None, where: object = None) -> bool:
    """The errors orbax leaves behind once it has raised the one that matters: reads or
    writes still in flight that find their event loop closed, and the abandoned
    coroutines of a failed read."""
    text = f"{error} {where}"
    return ("Event loop is closed" in text or "Encountered error while reading array" in text
            or "in OCDBT database" in text or "orbax" in repr(where))


class _OrbaxNoiseFilter(logging.Filter):
    """Drops orbax's own tracebacks of a failed background save (the error reaches the
    caller as one CheckpointWriteError), asyncio's "Task exception was never retrieved"
    of the array reads a failed restore abandoned (one DamagedCheckpointError names them),
    and orbax's "Metadata file does not exist" of an emptied step (the step's warning says
    it cannot be read)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return not ("orbax" in record.pathname
                        and str(record.msg).startswith("Metadata file does not exist"))
        return not ("orbax" in record.pathname or is_orbax_noise(record.exc_info[1]))


_NOISY_LOGGERS = ("absl", "asyncio")


class QuietOrbax:
    """While any Checkpointer is open, Python's hooks skip the noise above (each failed
    checkpoint read or write otherwise prints dozens of tracebacks) and pass on all else."""

    users = 0
    saved: tuple = ()
    log_filter = _OrbaxNoiseFilter()

    @classmethod
    def enter(cls) -> None:
        cls.users += 1
        if cls.users > 1:
            return
        cls.saved = sys.excepthook, threading.excepthook, sys.unraisablehook
        hook, thread_hook, unraisable_hook = cls.saved
        sys.excepthook = lambda kind, error, tb: (
            None if is_orbax_noise(error) else hook(kind, error, tb))
        threading.excepthook = lambda args: (
            None if is_orbax_noise(args.exc_value) else thread_hook(args))
        sys.unraisablehook = lambda u: (
            None if is_orbax_noise(u.exc_value, u.object) else unraisable_hook(u))
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).addFilter(cls.log_filter)

    @classmethod
    def exit(cls) -> None:
        cls.users -= 1
        if cls.users == 0:
            sys.excepthook, threading.excepthook, sys.unraisablehook = cls.saved
            for name in _NOISY_LOGGERS:
                logging.getLogger(name).removeFilter(cls.log_filter)


@contextlib.contextmanager
def settled_on_failure(grace_s: float = 0.5):
    """When one array fails, orbax raises at once while the other arrays' reads or writes
    are still in flight (they end within milliseconds): on a failure, wait `grace_s` and
    collect their coroutines, so their noise ends while it is still filtered. A coroutine
    abandoned before it started warns as it is collected ("coroutine
    '_read_array_index_and_device_put' was never awaited", seen once in three runs of the
    suite): that warning is dropped here, where only the failed read's coroutines are freed."""
    try:
        yield
    except BaseException:
        time.sleep(grace_s)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited",
                                    RuntimeWarning)
            gc.collect()
        raise


def error_line(error: BaseException) -> str:
    """One line: the start of the message and, in a long one, the OS error it names
    (tensorstore's messages end with pages of JSON spec)."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    text = text.split(" See full TensorStore details")[0]
    if len(text) <= 300:
        return text
    code = re.search(r"\[os_error_code='?(\d+)'?\]", text)
    tail = f"{os.strerror(int(code.group(1)))} (OS error {code.group(1)})" if code else text[-150:]
    return f"{text[:200]} ... {tail}"
