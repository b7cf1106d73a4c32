"""What made a file: the commit of the checkout, the versions; in checkpoints and reports."""

import subprocess

import jax

import transformer_jax as tj
from transformer_jax import provenance
from transformer_jax.checkpoint import Checkpointer


def test_source_commit_names_the_checkout_and_whether_it_was_changed(tmp_path):
    """The checkout's commit, "+dirty" once a tracked file differs from it (an untracked one
    does not count); None outside a git checkout."""
    assert provenance.source_commit(tmp_path) is None

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "step.py").write_text("a = 1\n")
    git("add", "step.py")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD")
    (tmp_path / "notes.txt").write_text("untracked")
    assert provenance.source_commit(tmp_path) == head and len(head) == 40
    (tmp_path / "step.py").write_text("a = 2\n")
    assert provenance.source_commit(tmp_path) == head + "+dirty"


def test_version_of_a_missing_distribution_is_none():
    assert provenance.version("no-such-distribution-of-this-name") is None
    assert provenance.version("jax") == jax.__version__


def test_checkpoints_name_the_code_that_wrote_them(trained_run):
    checkpointer = Checkpointer(str(trained_run.workdir / "checkpoints"), keep=1)
    software = checkpointer.metadata(checkpointer.all_steps()[-1])["software"]
    checkpointer.close()
    assert software["transformer_jax"] == tj.__version__ and software["jax"] == jax.__version__
    assert software["commit"] == provenance.source_commit()
