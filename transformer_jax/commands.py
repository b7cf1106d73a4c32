"""What the commands (translate.py, evaluate.py) share: results written whole or not at
all, stdout that reports a full disk and a reader gone away, and Ctrl-C in one line.
"""

import _thread
import contextlib
import functools
import os
import signal
import sys
import threading

from transformer_jax.atomic_file import atomic_write


class OutputError(OSError):
    """A file of the results that could not be written; `filename` names it."""


def write_whole(texts: dict[str, str]) -> None:
    """Writes each UTF-8 text of `texts` ({path: text}) whole or not at all, and all or none:
    every text is written and flushed (where a full disk fails) before any replaces its path
    (`atomic_file.atomic_write`). A path that exists and is not a regular file (/dev/stdout,
    a pipe) is written straight to. An OutputError names the path it could not write."""
    with contextlib.ExitStack() as stack:
        for path, text in texts.items():
            f = stack.enter_context(_whole(path))
            f.write(text)
            f.flush()


@contextlib.contextmanager
def _whole(path: str):
    """An `atomic_write` file for `path` (a link keeps its target), or `path` itself where it
    is not a regular file; an OSError becomes an OutputError naming `path`."""
    try:
        if os.path.exists(path) and not os.path.isfile(path):
            opened = open(path, "w", encoding="utf-8")
        else:
            opened = atomic_write(os.path.realpath(path), "w", encoding="utf-8")
        with opened as f:
            yield f
    except OutputError:
        raise  # another path's, on its way out through this one
    except OSError as error:
        raise OutputError(error.errno, error.strerror, path) from None


@contextlib.contextmanager
def interrupt_in_one_line():
    """Ctrl-C inside the block ends the process with "error: interrupted" on stderr and no
    traceback. It then ends by SIGINT, as Python's own Ctrl-C does (status 130 in a shell,
    and a shell loop running the command stops too), without the interpreter's teardown,
    which may crash after a stop inside an XLA compilation (train.py). A command that turned
    Ctrl-C off while it imported (SIG_DFL: quiet death) has it turned back on here."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = sys.unraisablehook
    ours = sys.unraisablehook = functools.partial(_interrupt_again, previous=previous)
    try:
        yield
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(128 + signal.SIGINT)  # had the signal not ended the process
    finally:
        # Only if still ours: a hook set inside the block (checkpoint.py's, which filters
        # the noise of a failed read still to come) calls ours, which calls `previous`.
        if sys.unraisablehook is ours:
            sys.unraisablehook = previous


def _interrupt_again(unraisable, previous) -> None:
    """Python drops (and prints) a KeyboardInterrupt raised where it cannot propagate, such
    as jax's garbage-collector callback: it is sent again 10 ms later, to be raised in the
    command's own code (as `stop_signal.StopSignal` does in training)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        threading.Timer(0.01, _thread.interrupt_main).start()
    else:
        previous(unraisable)


def write_stdout(text: str, chars: int = 1024) -> None:
    """Writes and flushes `text` to stdout, in pieces its buffer holds: Python's write of a
    larger piece can stop short, silently, when the reader goes away or the disk fills.
    On an OSError (BrokenPipeError: the reader went away, as `| head` does) stdout is first
    pointed at /dev/null, so that the exit's own flush reports nothing more, and the error
    is raised."""
    try:
        for start in range(0, len(text), chars):  # at most 4 KiB of UTF-8 each
            sys.stdout.write(text[start:start + chars])
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise
