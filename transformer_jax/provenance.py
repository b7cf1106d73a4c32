"""What made a file: the package's version and commit, and the libraries' versions.

Written into every checkpoint's metadata and every benchmark report, so a result or a
checkpoint names the code behind it.
"""

import functools
import importlib.metadata
import pathlib
import subprocess

LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
PACKAGE = pathlib.Path(__file__).parent


def version(distribution: str) -> str | None:
    """The installed version of `distribution`, or None if it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_version() -> str:
    """transformer_jax's installed version; "unknown" for a checkout never installed."""
    return version("transformer_jax") or "unknown"


def source_commit(folder=PACKAGE) -> str | None:
    """The git commit of the checkout whose tracked files `folder` holds (this package's by
    default), with "+dirty" when a tracked file differs from it; None where `folder` is not
    tracked (an installed wheel, even inside another project's repository) or git is missing."""
    def git(*args):
        return subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args],
                              capture_output=True, text=True, timeout=5, check=True).stdout.strip()

    try:
        git("ls-files", "--error-unmatch", ".")  # fails where no file of `folder` is tracked
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


@functools.cache  # git runs once per process
def software(*extra: str) -> dict:
    """{"transformer_jax": version, "commit": ..., and each of LIBRARIES and `extra`: version}."""
    return {"transformer_jax": package_version(), "commit": source_commit(),
            **{name: version(name) for name in (*LIBRARIES, *extra)}}
