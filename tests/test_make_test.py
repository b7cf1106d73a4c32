"""`make test`'s own command does what the Makefile says of it."""

import subprocess
import sys

GROUPED = '''
import os, pathlib, time, pytest

def record(kind):
    time.sleep(0.2)  # long enough that both workers are busy
    with open(pathlib.Path(__file__).parent / f"{kind}.workers", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.xdist_group("shared_fixture")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    record("grouped")

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    record("free")
'''


def test_an_xdist_group_runs_in_one_worker(tmp_path):
    """`-n 2 --dist loadgroup` sends an xdist_group's tests to one worker, so that their
    module's fixtures (an export, the multi-process runs) are made once. With pytest 9.2 and
    pytest-xdist 3.8 it silently did not (pytest-dev/pytest-xdist#1386): each group's
    fixtures were made in both workers, the multi-process runs' 50 s twice."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
                           "-q", "-p", "no:cacheprovider", "test_grouped.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    grouped = (tmp_path / "grouped.workers").read_text().split()
    free = (tmp_path / "free.workers").read_text().split()
    assert len(grouped) == 6 and len(set(grouped)) == 1, grouped
    assert set(free) | set(grouped) == {"gw0", "gw1"}, (free, grouped)  # both workers ran
