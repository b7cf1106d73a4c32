"""One training run per workdir: `train.lock`, held with an OS file lock while train() runs.

    with workdir_lock("runs/x"):   # ConfigError naming the other run's host and pid if busy
        ...

The lock is `fcntl.flock` on DIR/train.lock, which the OS releases when its process
ends, however it ends: a lock left by a killed run (kill -9, a crash) is taken over
at once, with a warning naming the run that left it. The file holds the holder's
host, pid and start time, for the message a second run gets. flock is not reliable
on every network file system; there, two runs on one workdir are not detected.
"""

import contextlib
import fcntl
import json
import os
import socket
import time
import warnings

from transformer_jax.config_checks import ConfigError

LOCK_FILE = "train.lock"


@contextlib.contextmanager
def workdir_lock(workdir: str, what: str = "training run"):
    """Holds DIR/train.lock for the duration; raises ConfigError if another run holds it.
    `what` holds it ("training run", "data preparation"): the other's message names it."""
    path = os.path.join(workdir, LOCK_FILE)
    with open(path, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(f)
            raise ConfigError(f"{workdir} is in use by another {_what(f)} ({holder}); "
                              f"wait for it, stop it, or use another --workdir") from None
        left = _holder(f)
        if left != "unknown":
            # Raised here, in the package (command lines write its warnings in one line):
            # the caller's frame depends on how it enters (the trainer's ExitStack put it in
            # contextlib.py, written as Python writes a library's warning).
            warnings.warn(f"{workdir}: taking over the lock of a run that ended without "
                          f"releasing it ({left})")
        f.seek(0)
        f.truncate()
        json.dump({"host": socket.gethostname(), "pid": os.getpid(),
                   "started": time.strftime("%Y-%m-%d %H:%M:%S"), "what": what}, f)
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()  # empty: released cleanly
            fcntl.flock(f, fcntl.LOCK_UN)


def _holder(f) -> str:
    """'host H, pid P, started T' from the lock file's contents, or 'unknown'."""
    f.seek(0)
    try:
        holder = json.loads(f.read())
        return f"host {holder['host']}, pid {holder['pid']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):
        return "unknown"


def _what(f) -> str:
    """What holds the lock, from the lock file's contents; "training run" if it does not say."""
    f.seek(0)
    try:
        what = json.loads(f.read()).get("what")
    except (ValueError, AttributeError):
        what = None
    return what if isinstance(what, str) and what else "training run"
