"""What made a file: the package's version and commit, and the libraries' versions.

Written into every checkpoint's metadata and every benchmark report, so a result or a
checkpoint names the code behind it.
"""

import importlib.metadata
import pathlib
import subprocess

LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")


def version(package: str) -> str | None:
    """The installed version of the distribution `package`, or None if it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def source_commit(folder=pathlib.Path(__file__).parent) -> str | None:
    """The git commit of the checkout holding `folder` (this package's by default), with
    "+dirty" when a tracked file differs from it; None outside a git checkout (an installed
    wheel) or without git."""
    def git(*args):
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def software(*extra: str) -> dict:
    """{"transformer_jax": version, "commit": ..., and each of LIBRARIES and `extra`: version}."""
    return {"transformer_jax": version("transformer_jax"), "commit": source_commit(),
            **{name: version(name) for name in (*LIBRARIES, *extra)}}
