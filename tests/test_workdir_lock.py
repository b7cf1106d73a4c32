"""One training run per workdir: a second is refused at once, a dead run's lock is taken over."""

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import warnings

import pytest

from run_configs import ROOT, tiny_run
from transformer_jax.config_checks import ConfigError
from transformer_jax.trainer import train
from transformer_jax import workdir_lock as workdir_lock_module
from transformer_jax.workdir_lock import LOCK_FILE, workdir_lock

HOLD = ("import sys, time; from transformer_jax.workdir_lock import workdir_lock\n"
        "with workdir_lock(sys.argv[1]):\n"
        "    print('held', flush=True); time.sleep(120)")


@pytest.fixture
def holder(tmp_path):
    """A process holding tmp_path's lock (python alone, no JAX work); killed afterwards."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def test_a_second_run_is_refused_naming_the_first(tmp_path, holder):
    expected = (rf"{tmp_path} is in use by another training run \(host "
                rf"{socket.gethostname()}, pid {holder.pid}, started .*\); wait for it")
    with pytest.raises(ConfigError, match=expected):
        train(tiny_run(), str(tmp_path))
    done = subprocess.run([sys.executable, "train.py", "--config=configs/default.py",
                           f"--workdir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path} is in use")
    assert not (tmp_path / "checkpoints").exists()


def test_the_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path, holder):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with pytest.warns(UserWarning, match=rf"taking over the lock of a run that ended without "
                                         rf"releasing it \(host .*, pid {holder.pid},") as seen:
        with contextlib.ExitStack() as held:  # as the trainer enters it
            held.enter_context(workdir_lock(str(tmp_path)))
            mine = json.loads((tmp_path / LOCK_FILE).read_text())
    # Raised in the package, which the command lines' one-line warnings recognise by its file.
    assert seen[0].filename == workdir_lock_module.__file__
    assert mine["pid"] == os.getpid() and mine["host"] == socket.gethostname()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released cleanly: empty
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean release leaves nothing to take over
        with workdir_lock(str(tmp_path)):
            pass


def test_the_refusal_names_what_holds_the_workdir(tmp_path):
    """A second command on a workdir that the data command is preparing was told "another
    training run"."""
    with workdir_lock(str(tmp_path), "data preparation"):
        with open(tmp_path / LOCK_FILE, encoding="utf-8") as f:
            assert json.load(f)["what"] == "data preparation"
        done = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert (f"{tmp_path} is in use by another data preparation (host {socket.gethostname()}, "
            f"pid {os.getpid()}, started ") in done.stderr


@contextlib.contextmanager
def held_elsewhere(workdir, contents: str):
    """The workdir's lock held through another open file of this process, the lock file
    holding `contents` (flock locks belong to an open file: workdir_lock finds it busy)."""
    with open(workdir / LOCK_FILE, "w", encoding="utf-8") as f:
        f.write(contents)
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield


@pytest.mark.parametrize("contents, holder", [
    ('{"host": "h", "pid": 7, "started": "s"}', "training run (host h, pid 7, started s)"),
    ('{"host": "h", "pid": 7, "started": "s", "what": "data preparation"}',
     "data preparation (host h, pid 7, started s)"),
    ('{"host": "h", "pid": 7, "started": "s", "what": ""}',
     "training run (host h, pid 7, started s)"),
    ('{"host": "h", "pid": 7, "started": "s", "what": 5}',
     "training run (host h, pid 7, started s)"),
    ('{"host": "h", "pid": 7}', "training run (unknown)"),
    ("[1, 2]", "training run (unknown)"),
    ("", "training run (unknown)"),
])
def test_a_refusal_names_what_the_lock_file_says_and_no_more(tmp_path, contents, holder):
    """A lock file of another version, or not yet written, still gives one line: what
    it does not say is "training run" and "unknown"."""
    with held_elsewhere(tmp_path, contents):
        with pytest.raises(ConfigError) as error:
            with workdir_lock(str(tmp_path)):
                pass
    assert str(error.value) == (f"{tmp_path} is in use by another {holder}; wait for it, stop "
                                f"it, or use another --workdir")


def test_a_lock_file_left_that_names_no_run_is_taken_over_quietly(tmp_path):
    (tmp_path / LOCK_FILE).write_text("[1, 2]")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with workdir_lock(str(tmp_path), "data preparation"):
            mine = json.loads((tmp_path / LOCK_FILE).read_text())
    assert mine["what"] == "data preparation" and mine["pid"] == os.getpid()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", mine["started"]), mine


def test_a_block_that_raises_releases_the_lock_cleanly(tmp_path):
    with pytest.raises(RuntimeError):
        with workdir_lock(str(tmp_path)):
            raise RuntimeError("the run failed")
    assert (tmp_path / LOCK_FILE).read_text() == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with workdir_lock(str(tmp_path)):
            pass
