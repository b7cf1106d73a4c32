"""Tokenizing a large corpus on every core: worker processes, each with its own tokenizer.

    for lengths, ids in encode_in_processes(tokenizer, batches, dtype=np.uint16,
                                            add_eos=True, processes=16):
        ...  # one result per batch of texts, in order

SentencePiece's own threads (`Tokenizer.encode_batch(num_threads=...)`) encode in
parallel, but its batch call reads the texts in and builds the Python lists of ids
out in the calling thread, and those lists then become arrays there too: on the
2-core CPU this serial part was 15 % of one thread's time (two threads 1.74 x one,
two processes 1.92 x; BENCHMARKS.md, "pipeline: tokenizing in worker processes").
By Amdahl's law that would hold 16 threads under 5 x one. Processes each turn
their own lists into arrays and send back only those.

Processes are started with "spawn", not "fork": JAX's threads may be running in
the calling process, and a forked copy of them can deadlock. A spawned process
would also run the caller's script again up to its `if __name__ == "__main__":`
line, so a script without that line would prepare its data again in every
worker: the workers start with the main module hidden (`main_module_hidden`).
Each imports the package's tokenizer and nothing heavier: the package imports its
names on first use, so a worker starts without JAX (0.15 s and 40 MB, not 1.2 s and
210 MB). Small corpora still stay in the calling process
(`prepared_writer.PROCESS_MIN_PAIRS`). A worker
whose calling process dies (kill -9) exits too, and Ctrl-C is the calling
process's to handle.

The standard library's pool rather than grain's: grain's workers take their
input from a data source pickled into each of them, where this sends each
worker only its batch of texts.
"""

import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from transformer_jax.data.sources import DataError
from transformer_jax.data.tokenizer import Tokenizer

_tokenizer: Tokenizer | None = None  # a worker process's own, from `_start_worker`
_main_module_lock = threading.Lock()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def encode_in_processes(tokenizer: Tokenizer, batches: Iterable[list[str]], *, dtype,
                        add_eos: bool, processes: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`tokenizer.encode_arrays(texts)` of each batch of texts, in the order of `batches`,
    encoded by `processes` worker processes. Leaving the loop early cancels the batches
    not yet started and waits for the running ones (a few seconds at most). A worker that
    dies (out of memory) is a DataError."""
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(tokenizer,))
    try:
        # With "spawn", CPython (3.9 and later) starts the pool's processes in `submit`,
        # which `map` calls for every batch before it returns.
        with main_module_hidden():
            encoded = pool.map(functools.partial(_encode, dtype=dtype, add_eos=add_eos),
                               batches)
        yield from encoded
    except BrokenProcessPool as error:
        raise DataError(f"a worker process tokenizing the corpus died ({error}); memory "
                        f"may be short: prepare again with fewer processes "
                        f"(prepare(processes=N), 0 for none); whole parts are kept") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def main_module_hidden():
    """`sys.modules["__main__"]` replaced by an empty module, which a spawned process does
    not import (`multiprocessing.spawn.get_preparation_data` reads it as processes start).
    One caller at a time, so that two never restore each other's empty module."""
    with _main_module_lock:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


def follow_calling_process() -> None:
    """A pool worker's start (`initializer=`): Ctrl-C, which a terminal sends the whole
    process group, is the calling process's to handle (it stops the pool, in one line), and
    the worker exits once the calling process is gone: the pool's queues would otherwise
    keep it waiting forever, holding the caller's stderr open."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _start_worker(tokenizer: Tokenizer) -> None:
    global _tokenizer
    _tokenizer = tokenizer
    follow_calling_process()


def _exit_with(parent_sentinel) -> None:
    multiprocessing.connection.wait([parent_sentinel])
    os._exit(1)


def _encode(texts: list[str], dtype, add_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    return _tokenizer.encode_arrays(texts, dtype=dtype, add_eos=add_eos)
