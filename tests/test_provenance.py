"""What made a file: the commit of the checkout, the versions; in checkpoints and reports."""

import pathlib
import subprocess

import flax
import jax
import numpy as np

import transformer_jax as tj
from transformer_jax import provenance
from transformer_jax.checkpoint import Checkpointer

ROOT = pathlib.Path(__file__).resolve().parents[1]


def git(folder, *args) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t",
                           "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_source_commit_names_the_checkout_and_whether_it_was_changed(tmp_path):
    """The checkout's commit, "+dirty" once a tracked file differs from it (an untracked one
    does not count); None outside a git checkout, and in a folder of one that git does not
    track (a package installed into a virtual environment inside a project)."""
    assert provenance.source_commit(tmp_path) is None
    git(tmp_path, "init", "-q")
    (tmp_path / "step.py").write_text("a = 1\n")
    (tmp_path / ".gitignore").write_text(".venv/\n")
    git(tmp_path, "add", "step.py", ".gitignore")
    git(tmp_path, "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "notes.txt").write_text("untracked")
    assert provenance.source_commit(tmp_path) == head and len(head) == 40
    installed = tmp_path / ".venv" / "site-packages" / "transformer_jax"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    assert provenance.source_commit(installed) is None
    (tmp_path / "step.py").write_text("a = 2\n")
    assert provenance.source_commit(tmp_path) == head + "+dirty"


def test_version_of_a_missing_distribution_is_none():
    assert provenance.version("no-such-distribution-of-this-name") is None
    assert provenance.version("jax") == jax.__version__


def test_without_git_there_is_no_commit(tmp_path, monkeypatch):
    """git not installed (a container with Python alone): None, not a FileNotFoundError."""
    git(tmp_path, "init", "-q")
    monkeypatch.setenv("PATH", str(tmp_path / "no_programs_here"))
    assert provenance.source_commit(tmp_path) is None


def test_a_checkout_never_installed_has_an_unknown_version(monkeypatch):
    monkeypatch.setattr(provenance, "version", lambda distribution: None)
    assert provenance.package_version() == "unknown"


def test_software_names_the_package_its_commit_and_each_library_asked_for():
    software = provenance.software("numpy")
    assert list(software) == ["transformer_jax", "commit", "jax", "jaxlib", "flax", "optax",
                              "orbax-checkpoint", "numpy"]
    assert software["numpy"] == np.__version__ and software["flax"] == flax.__version__
    assert software["transformer_jax"] == tj.__version__


def test_checkpoints_name_the_code_that_wrote_them(trained_run):
    """The metadata names this checkout's commit (git asked here, independently) and the
    versions."""
    checkpointer = Checkpointer(str(trained_run.workdir / "checkpoints"), keep=1)
    software = checkpointer.metadata(checkpointer.all_steps()[-1])["software"]
    checkpointer.close()
    assert software["transformer_jax"] == tj.__version__ and software["jax"] == jax.__version__
    if (ROOT / ".git").exists():  # a checkout (CI's is a fresh clone), not an unpacked sdist
        assert software["commit"].partition("+")[0] == git(ROOT, "rev-parse", "HEAD")
