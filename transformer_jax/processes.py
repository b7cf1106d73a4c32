"""The processes of a multi-host run: waiting for process 0, and ending when a peer is lost.

    first_then_others(fn, "prepare the data")   # fn on process 0, then on the others
    end_at_once_on_errors()                     # parallel.initialize_processes installs it

The waits go through JAX's coordination service (the key-value store that
`jax.distributed.initialize` starts in process 0), never through a collective: a
first collective over gloo gives up after 30 s ("Gloo context initialization failed:
DEADLINE_EXCEEDED"), a key waited for here has no deadline.

A lost peer, as JAX 0.10 on CPU shows it to the others:
- a collective with it fails, a Python error that `end_at_once_on_errors` turns into
  one line and exit status 1: at once, or after `parallel.COLLECTIVE_TIMEOUT_S` (seen
  with several devices per process);
- if the coordination service declares it dead first (no heartbeat for
  `parallel.HEARTBEAT_TIMEOUT_S`), JAX aborts the others from C++, exit status 134;
- process 0, which hosts the service: the others' clients abort from C++ at once.
The aborts are LOG(FATAL) in xla/pjrt/distributed/client.h ("Terminating process
because the JAX distributed service detected fatal errors"), on a thread of JAX's
coordination client; Python cannot catch them (jaxlib's `missed_heartbeat_callback`
takes no Python function in this version: it fails with std::bad_cast).
"""

import itertools
import os
import sys

import jax
from jax._src import distributed

_POLL_MS = 1000  # one wait on the key-value store: signals (Ctrl-C) are handled between waits
_calls = itertools.count()  # every process calls first_then_others in the same order


class PeerFailedError(RuntimeError):
    """Another process of the run failed at what this one waits for; said in one line."""


def _coordination_client():
    """JAX's coordination-service client, for its key-value store. JAX offers no public
    handle on it; orbax (`multihost.get_jax_distributed_client`) and
    `jax.experimental.multihost_utils.live_devices` reach it the same way."""
    return distributed.global_state.client


def _wait_for_key(client, key: str) -> str:
    """The key's value once some process sets it, however long that takes."""
    while True:
        try:
            return client.blocking_key_value_get(key, _POLL_MS)
        except jax.errors.JaxRuntimeError as error:
            if not str(error).startswith("DEADLINE_EXCEEDED"):
                raise


def _run_and_announce(fn, client, key: str):
    """`fn()`, then "ok" or its error's first line under `key` for the others to read."""
    try:
        result = fn()
    except BaseException as error:
        client.key_value_set(key, f"failed: {_first_line(error)}")
        raise
    client.key_value_set(key, "ok")
    return result


def _check(client, key: str, process: int, what: str) -> None:
    """Waits for `process`'s outcome; raises PeerFailedError if it failed."""
    outcome = _wait_for_key(client, key)
    if outcome != "ok":
        raise PeerFailedError(f"process {process} could not {what}: "
                              f"{outcome.removeprefix('failed: ')}")


def first_then_others(fn, what: str):
    """Runs `fn` on process 0, then on the others, so they find what it wrote.

    The others print that they wait, and wait as long as process 0 takes. Then every
    process waits until all have run `fn`, so that they reach their first collective
    together. If `fn` fails in one process, the others raise PeerFailedError naming
    that process and its error, instead of waiting. One process: just `fn()`.
    """
    if jax.process_count() == 1:
        return fn()
    client, me = _coordination_client(), jax.process_index()
    prefix = f"transformer_jax/first_then_others/{next(_calls)}"
    if me != 0:
        print(f"process {me}: waiting for process 0 to {what} (as long as it takes; "
              f"process 0's output shows its progress)", flush=True)
        _check(client, f"{prefix}/0", 0, what)
    result = _run_and_announce(fn, client, f"{prefix}/{me}")
    for other in range(1, jax.process_count()):  # process 0's outcome is known by now
        if other != me:
            _check(client, f"{prefix}/{other}", other, what)
    return result


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def lost_peer(error: BaseException | None) -> bool:
    """Whether `error` (or one it came from) says another process of the run is gone:
    a collective over gloo or a call to the coordination service failed."""
    while error is not None:
        text = str(error)
        if "Gloo" in text or "coordination service" in text:
            return True
        error = error.__cause__ or error.__context__
    return False


def end_at_once_on_errors() -> None:
    """From now on an uncaught exception ends this process at once, exit status 1.

    Python's own exit would first run JAX's distributed shutdown, a barrier of every
    process: with a peer gone, or still waiting in a collective for this one, it holds
    for minutes and then aborts. A lost peer is said in one line; any other error keeps
    its traceback. PeerFailedError, one line too, is the exception: it exits through
    that barrier, as the failed peer does.
    """
    previous = sys.excepthook

    def hook(kind, error, traceback):
        if isinstance(error, PeerFailedError):
            print(f"error: {error}", file=sys.stderr, flush=True)
            return
        if lost_peer(error):
            print(f"error: process {jax.process_index()} lost contact with another process "
                  f"of the run (it stopped, or did not reach the same collective in time; see "
                  f"its output): {_first_line(error)}", file=sys.stderr, flush=True)
        else:
            previous(kind, error, traceback)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    sys.excepthook = hook
