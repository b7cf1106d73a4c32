"""The processes of a multi-host run: joining it, waiting for process 0, and ending when a
peer is lost.

    initialize_processes("host0:1234", 2, 1)    # or cluster=True: SLURM, Open MPI, Cloud TPU
    first_then_others(fn, "prepare the data")   # fn on process 0, then on the others
    end_at_once_on_errors()                     # initialize_processes installs it

The waits go through JAX's coordination service (the key-value store that
`jax.distributed.initialize` starts in process 0), never through a collective: a
first collective over gloo gives up after 30 s ("Gloo context initialization failed:
DEADLINE_EXCEEDED"), a key waited for here has no deadline.

A lost peer, as JAX 0.10 on CPU shows it to the others:
- a collective with it fails, a Python error that `end_at_once_on_errors` turns into
  one line and exit status 1: at once, or after `COLLECTIVE_TIMEOUT_S` (seen
  with several devices per process);
- if the coordination service declares it dead first (no heartbeat for
  `HEARTBEAT_TIMEOUT_S`), JAX aborts the others from C++, exit status 134;
- process 0, which hosts the service: the others' clients abort from C++ at once.
The aborts are LOG(FATAL) in xla/pjrt/distributed/client.h ("Terminating process
because the JAX distributed service detected fatal errors"), on a thread of JAX's
coordination client; Python cannot catch them (jaxlib's `missed_heartbeat_callback`
takes no Python function in this version: it fails with std::bad_cast).

JAX is imported in the functions that join and wait, not above: train.py defines its flags
from the limits here, and answers a bad command line before JAX loads.
"""

import itertools
import os
import socket
import sys
import time

# A process that stops answering is declared dead between half of HEARTBEAT_TIMEOUT_S
# and all of it, and JAX then aborts every other process from C++ (JAX's default: 100 s).
# A collective waiting for it fails sooner, in Python, after COLLECTIVE_TIMEOUT_S (XLA's
# default: 30 min), and that is said in one line.
HEARTBEAT_TIMEOUT_S = 300
COLLECTIVE_TIMEOUT_S = 60
JOIN_TIMEOUT_S = 300  # how long the processes wait for one another to start (JAX's default)
_POLL_MS = 1000  # one wait on the key-value store: signals (Ctrl-C) are handled between waits
_calls = itertools.count()  # every process calls first_then_others in the same order


class PeerFailedError(RuntimeError):
    """Another process of the run failed at what this one waits for; said in one line."""


class JoinError(ValueError):
    """A run of several processes that cannot start: flags that do not fit together, no
    cluster to read them from, or a process 0 that does not answer."""


def with_collective_timeout(xla_flags: str, seconds: int = COLLECTIVE_TIMEOUT_S) -> str:
    """`xla_flags` (the XLA_FLAGS variable) with a timeout for CPU collectives, unless
    they set one."""
    if "--xla_cpu_collective_timeout_seconds" in xla_flags:
        return xla_flags
    return f"{xla_flags} --xla_cpu_collective_timeout_seconds={seconds}".strip()


def several_processes(coordinator_address=None, num_processes=None, process_id=None, *,
                      cluster: bool = False) -> bool:
    """Whether train.py's flags ask for a run of several processes: all three given (or
    `cluster`), or none, or a run of one. A JoinError names what does not fit."""
    given = {"--coordinator_address": coordinator_address, "--num_processes": num_processes,
             "--process_id": process_id}
    named = [flag for flag, value in given.items() if value is not None]
    if cluster and named:
        raise JoinError(f"--cluster reads the run from the cluster's environment; give it or "
                        f"{', '.join(named)}, not both")
    if cluster or not named:
        return cluster
    if num_processes is not None and num_processes < 1:
        raise JoinError(f"--num_processes must be 1 or more, got {num_processes}")
    if num_processes == 1 and process_id in (None, 0):  # a run of one: nothing to join
        return False
    if missing := [flag for flag, value in given.items() if value is None]:
        raise JoinError(f"a run of several processes needs --coordinator_address, "
                        f"--num_processes and --process_id in every process; "
                        f"{', '.join(missing)} missing")
    if not 0 <= process_id < num_processes:
        raise JoinError(f"--process_id must be in 0..{num_processes - 1} for "
                        f"--num_processes={num_processes}, got {process_id}")
    _host_and_port(coordinator_address)
    return True


def _host_and_port(address: str) -> tuple[str, int]:
    """("host0", 1234) from "host0:1234" ("[::1]:1234": "::1"); a JoinError otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise JoinError(f"--coordinator_address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def initialize_processes(coordinator_address=None, num_processes=None, process_id=None, *,
                         cluster: bool = False, timeout_s: int = JOIN_TIMEOUT_S) -> None:
    """Joins a run of several processes (JAX's multi-controller runtime); no-op for one.

    `cluster`: JAX reads the three from the cluster's environment (SLURM, Open MPI, Cloud
    TPU), and waits for the others itself. Otherwise one line says whom this process
    joins, and a process other than 0 first waits for process 0 to answer at
    `coordinator_address` (a JoinError, not JAX's abort from C++ after minutes); all
    waits together last at most `timeout_s`. On CPUs the processes sum over
    gloo, and a collective waits at most COLLECTIVE_TIMEOUT_S for the others
    (`--xla_cpu_collective_timeout_seconds=N` in XLA_FLAGS sets another). From then on an
    uncaught exception ends the process at once, in one line if a peer was lost
    (`end_at_once_on_errors`).
    """
    if not several_processes(coordinator_address, num_processes, process_id, cluster=cluster):
        return
    import jax

    if jax.config.jax_cpu_collectives_implementation == "none":  # older JAX's default
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Read when the backend starts, which jax.distributed.initialize must precede.
    os.environ["XLA_FLAGS"] = with_collective_timeout(os.environ.get("XLA_FLAGS", ""))
    deadline = time.monotonic() + timeout_s
    if not cluster:
        print(f"process {process_id}: joining a run of {num_processes} processes at "
              f"{coordinator_address} (waiting up to {timeout_s} s for the others)",
              file=sys.stderr, flush=True)
        if process_id != 0:
            _wait_for_coordinator(coordinator_address, timeout_s)
    left_s = max(1, round(deadline - time.monotonic()))  # of the one limit for all waits
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   initialization_timeout=left_s,
                                   heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
    except ValueError as error:  # --cluster where JAX finds none, or a value it refuses
        where = ("no cluster here to read the run from (SLURM, Open MPI, Cloud TPU)"
                 if cluster else "JAX refuses the run's flags")
        raise JoinError(f"{where}: {error}") from None
    end_at_once_on_errors()


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Returns once something answers at `address` (host:port; process 0's coordination
    service), or raises a JoinError after `timeout_s`."""
    host, port = _host_and_port(address)
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=5):
                return
        except OSError as error:
            last = error
            time.sleep(0.5)
    why = (last.strerror or str(last)) if last else "no answer"
    raise JoinError(f"process 0 did not answer at {address} within {timeout_s} s ({why}); "
                    f"start it, or check the address")


def _coordination_client():
    """JAX's coordination-service client, for its key-value store. JAX offers no public
    handle on it; orbax (`multihost.get_jax_distributed_client`) and
    `jax.experimental.multihost_utils.live_devices` reach it the same way."""
    from jax._src import distributed

    return distributed.global_state.client


def _wait_for_key(client, key: str) -> str:
    """The key's value once some process sets it, however long that takes."""
    import jax

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


def first_then_others(fn, what: str, *, quiet: bool = False):
    """Runs `fn` on process 0, then on the others, so they find what it wrote.

    The others print that they wait (unless `quiet`: for what takes no time), and wait as
    long as process 0 takes. Then every process waits until all have run `fn`, so that
    they reach their first collective together. If `fn` fails in one process, the others
    raise PeerFailedError naming that process and its error, instead of waiting. One
    process: just `fn()`.
    """
    import jax

    if jax.process_count() == 1:
        return fn()
    client, me = _coordination_client(), jax.process_index()
    prefix = f"transformer_jax/first_then_others/{next(_calls)}"
    if me != 0 and not quiet:
        print(f"process {me}: waiting for process 0 to {what} (as long as it takes; "
              f"process 0's output shows its progress)", flush=True)
    if me != 0:
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
    import jax

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
