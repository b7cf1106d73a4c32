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
their own lists into arrays and send back only those. Processes are started with "spawn", not "fork": JAX's threads
may be running in the calling process, and a forked copy of them can deadlock.
A spawned process would also run the caller's script again up to its
`if __name__ == "__main__":` line, so a script without that line would prepare
its data again in every worker: the workers start with the main module hidden
(`_main_module_hidden`), and import only this module. Starting them costs about
1.5 s (importing JAX), so small corpora stay in the calling process
(`prepared.PROCESS_MIN_PAIRS`).

The standard library's pool rather than grain's: grain's workers take their
input from a data source pickled into each of them, where this sends each
worker only its batch of texts.
"""

import contextlib
import functools
import multiprocessing
import os
import sys
import types
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from transformer_jax.data.tokenizer import Tokenizer, ids_arrays

_tokenizer: Tokenizer | None = None  # a worker process's own, from `_start_worker`


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def encode_in_processes(tokenizer: Tokenizer, batches: Iterable[list[str]], *, dtype,
                        add_eos: bool, processes: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`(lengths, ids)` of each batch of texts, as `ids_arrays` makes them, in the order of
    `batches`, encoded by `processes` worker processes. Leaving the loop early cancels the
    batches not yet started and waits for the running ones (a few seconds at most)."""
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(tokenizer,))
    try:
        with _main_module_hidden():  # the pool starts its processes as map submits the work
            encoded = pool.map(functools.partial(_encode, dtype=dtype, add_eos=add_eos),
                               batches)
        yield from encoded
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _main_module_hidden():
    """`sys.modules["__main__"]` replaced by an empty module, which a spawned process does
    not import (`multiprocessing.spawn.get_preparation_data` reads it as processes start)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _start_worker(tokenizer: Tokenizer) -> None:
    global _tokenizer
    _tokenizer = tokenizer


def _encode(texts: list[str], dtype, add_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    return ids_arrays(_tokenizer.encode_batch(texts, add_eos=add_eos), dtype)
