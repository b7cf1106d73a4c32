"""The code passes `ruff check` under pyproject.toml's [tool.ruff]: pycodestyle's errors and
warnings and pyflakes (unused imports and names, undefined names), lines of at most 100
characters."""

import pathlib
import subprocess
import sys

import pytest

# The dev extra installs it (`make test`); a machine given only the runtime's wheels, such as
# a GPU host without network, checks the code elsewhere.
pytest.importorskip("ruff", reason="ruff is in the dev extra (pip install -e '.[dev]')")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def ruff(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                           "--output-format=concise", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_the_project_passes_ruff():
    done = ruff(".")
    assert done.returncode == 0, done.stdout + done.stderr
    # What it checked: the package, the scripts, the tests, the examples and the notebooks.
    listed = ruff("--show-files", ".").stdout.splitlines()
    checked = {pathlib.Path(line).relative_to(ROOT).as_posix() for line in listed}
    assert {"train.py", "transformer_jax/trainer.py", "tests/test_lint.py",
            "examples/bible/build_corpus.py",
            "notebooks/01_attention_from_scratch.ipynb"} <= checked, sorted(checked)


def test_the_project_rules_find_what_they_name(tmp_path):
    """The same settings on a file with one fault of each kind: each is reported, so the
    check above is not passing for want of rules or files."""
    (tmp_path / "faults.py").write_text(
        "import os\n"  # F401: unused
        f"x = {'1 + ' * 25}1\n"  # E501: 105 characters
        "y = undefined_name  \n")  # F821, and W291: trailing spaces
    done = ruff(f"--config={ROOT / 'pyproject.toml'}", "faults.py", cwd=tmp_path)
    codes = {line.split()[1] for line in done.stdout.splitlines() if "faults.py:" in line}
    assert done.returncode == 1 and codes == {"F401", "E501", "F821", "W291"}, done.stdout
