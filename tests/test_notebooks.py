"""Every notebook in notebooks/ runs top to bottom in quick mode, and is stored without outputs."""

import os
import pathlib
import sys

import pytest

from conftest import JAX_RULES

# The notebooks extra (in the dev extra); a machine without it (a GPU host's own Python)
# skips the notebooks with this reason rather than failing the suite's collection.
nbformat = pytest.importorskip("nbformat", reason="the notebooks extra runs them "
                               "(pip install -e '.[notebooks]')")
NotebookClient = pytest.importorskip("nbclient", reason="the notebooks extra runs them "
                                     "(pip install -e '.[notebooks]')").NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
SIMULATED_DEVICES = "--xla_force_host_platform_device_count"


def kernel_env() -> dict[str, str]:
    """This process's environment in quick mode, without conftest.py's 8 simulated devices
    and JAX rules.

    Training on 8 simulated devices of a 2-core CPU is slow; the notebooks use the real
    ones. The notebooks are a user's code, run under JAX's defaults as in a user's kernel
    (their cells broadcast a bias over heads, which the tests' rank rule refuses).
    TFDS_DATA_DIR (conftest.py's scratch directory) passes through, so the small numbers
    split is built there, not in ~/tensorflow_datasets.
    """
    env = {name: value for name, value in os.environ.items()
           if name.lower() not in JAX_RULES}
    env["TRANSFORMER_JAX_NOTEBOOK_QUICK"] = "1"
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(SIMULATED_DEVICES)]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def test_there_are_notebooks():
    assert len(PATHS) >= 2, f"no notebooks found in {NOTEBOOKS}"


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_notebook_runs(path):
    """Every code cell in order, in a python3 kernel started in notebooks/; an error fails."""
    nb = nbformat.read(path, as_version=4)
    # One more cell: the kernel must be this environment's Python, where the package is.
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    client = NotebookClient(nb, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(env=kernel_env())  # raises CellExecutionError naming the cell
    assert all(cell.get("execution_count") for cell in nb.cells if cell.cell_type == "code")
    kernel_python = nb.cells[-1].outputs[0]["text"].strip()
    assert os.path.normpath(kernel_python) == os.path.normpath(sys.executable), kernel_python


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{path.name}: clear its outputs before committing")
