"""What the commands (translate.py, evaluate.py, the plot, benchmark and export commands)
share: results written whole or not at all, stdout that reports a full disk and a reader
gone away, Ctrl-C in one line, and words that are not flags refused.
"""

import contextlib
import functools
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import time

import tqdm

from transformer_jax.atomic_file import atomic_write


def refuse_arguments(argv: list[str], example: str) -> None:
    """Ends the command in one line when `argv` (absl's, the program first) holds words that
    are no flags: a file name after a command that reads --input would otherwise be ignored
    while it waits for stdin. `example` shows the flags, e.g. "--input=FILE"."""
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {' '.join(argv[1:])!r}: flags are --name=value, "
                 f"e.g. {example}")


class OutputError(OSError):
    """A file of the results that could not be written; `filename` names it."""


def write_whole(texts: dict[str, str]) -> None:
    """Writes each UTF-8 text of `texts` ({path: text}) whole or not at all, and all or none:
    every text is written and flushed (where a full disk fails) before any replaces its path
    (`atomic_file.atomic_write`). A path that exists and is not a regular file (/dev/stdout,
    a pipe) is written straight to. An OutputError names the path it could not write."""
    with contextlib.ExitStack() as stack:
        for path, text in texts.items():
            f = stack.enter_context(output_file(path))
            f.write(text)
            f.flush()


@contextlib.contextmanager
def output_file(path: str, mode: str = "w"):
    """A file a user named for a result, open for writing (`mode` "w", UTF-8, or "wb"): an
    `atomic_write` file for `path` (a link keeps its target), or `path` itself where it is
    not a regular file (/dev/stdout, a pipe), which renaming a file over would replace. An
    OSError becomes an OutputError naming `path`."""
    encoding = {"encoding": "utf-8"} if mode == "w" else {}
    try:
        if os.path.exists(path) and not os.path.isfile(path):
            opened = open(path, mode, **encoding)
        else:
            opened = atomic_write(os.path.realpath(path), mode, **encoding)
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
    Ctrl-C off while it imported (SIG_DFL: quiet death) has it turned back on here.

    Its KeyboardInterrupt is raised wherever Python is, and the code there may lose it:
    Python prints and drops one raised in a garbage-collector callback (jax's), and JAX
    drops one raised while it traces a function (jax 0.10.2: in a `__hash__` that its C++
    calls). So once Ctrl-C came, it is raised again every 0.2 s until the block handles it,
    and a block that ends first ends as interrupted all the same."""
    interrupt = _Interrupt()
    handler = signal.getsignal(signal.SIGINT)
    if handler is signal.SIG_DFL or handler is signal.default_int_handler:  # not SIG_IGN
        signal.signal(signal.SIGINT, interrupt.handle)
    previous = sys.unraisablehook
    ours = sys.unraisablehook = functools.partial(_drop_interrupt, previous=previous)
    try:
        yield
        if interrupt.requested:
            raise KeyboardInterrupt  # lost on its way out, and the block ended before again
    except KeyboardInterrupt:
        interrupt.handled.set()
        _end_progress_bars()
        print("error: interrupted", file=sys.stderr, flush=True)
        _end_child_processes()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(128 + signal.SIGINT)  # had the signal not ended the process
    finally:
        interrupt.handled.set()
        if signal.getsignal(signal.SIGINT) == interrupt.handle:
            signal.signal(signal.SIGINT, handler)
        # Only if still ours: a hook set inside the block (checkpoint.py's, which filters
        # the noise of a failed read still to come) calls ours, which calls `previous`.
        if sys.unraisablehook is ours:
            sys.unraisablehook = previous


def _end_progress_bars() -> None:
    """Closes the tqdm bars still open, so the error starts a line of its own: a `with`
    closes its bar as the interrupt passes, but not one interrupted inside tqdm's
    constructor, after it drew the bar (tqdm keeps its open bars in `_instances`)."""
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        bar.close()


def _end_child_processes() -> None:
    """Ends the worker processes of the block's pools and frees their queues' semaphores,
    as the teardown skipped here would: a pool's own shutdown, in a `finally` that waits
    for its workers, is cut short by the interrupt raised again, and the resource tracker
    would report the semaphores as leaked, after "error: interrupted"."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=5)
    # The exit-time finalizers of multiprocessing (priority >= 0: each semaphore's unlink),
    # which its own atexit function runs first; no public call runs them.
    multiprocessing.util._run_finalizers(0)  # noqa: SLF001


class _Interrupt:
    """interrupt_in_one_line's SIGINT handler: raises KeyboardInterrupt, the first time
    with a thread that sends the main thread SIGINT again every 0.2 s until `handled` is
    set (a signal, not `_thread.interrupt_main`, which would wait for a blocking call such
    as a sleep to return). Within 0.1 s of its last raise it does nothing: a signal already
    on its way would otherwise raise inside the clause that handles the last one."""

    def __init__(self):
        self.handled = threading.Event()
        self.raised_at: float | None = None
        self._main_thread = threading.main_thread().ident

    @property
    def requested(self) -> bool:
        return self.raised_at is not None

    def handle(self, signum, frame):
        del signum, frame
        now = time.monotonic()
        if self.handled.is_set() or (self.requested and now - self.raised_at < 0.1):
            return
        if not self.requested:
            threading.Thread(target=self._again, daemon=True).start()
        self.raised_at = now
        raise KeyboardInterrupt

    def _again(self) -> None:
        while not self.handled.wait(0.2):
            signal.pthread_kill(self._main_thread, signal.SIGINT)


def _drop_interrupt(unraisable, previous) -> None:
    """A KeyboardInterrupt Python could not raise (in a garbage-collector callback, a
    `__del__`) is dropped without the usual report: `_Interrupt` raises it again."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
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


def write_stdout_and_go_on(text: str) -> None:
    """`text` to stdout (`write_stdout`), where a failed write does not stop the command (the
    files it goes on to write still matter): a reader that went away (`| head`) is quiet,
    any other write error one warning on stderr."""
    try:
        write_stdout(text)
    except BrokenPipeError:
        pass
    except OSError as error:
        print(f"warning: cannot write to stdout: {error.strerror or error}", file=sys.stderr)
