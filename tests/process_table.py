"""Processes from /proc (Linux), for the tests and scripts that check none is left running."""

import os
import time


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def still_running(pids: list[int], seconds: float) -> list[int]:
    """Those of `pids` still running after up to `seconds`."""
    deadline, running = time.monotonic() + seconds, list(pids)
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [p for p in running if alive(p)]
    return running


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie that no one reaped has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
