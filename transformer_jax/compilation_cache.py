"""JAX's persistent compilation cache in a run's folder, for the commands that compile.

    use_compilation_cache(workdir)   # first thing in main, before anything compiles

train.py calls it, so a resumed run loads its compiled steps instead of compiling them
again; evaluate.py and translate.py call it too, so each later command loads the
searches an earlier one compiled (one program per batch shape: predict.py).
"""

import os

import jax

FOLDER = "compilation_cache"  # in the workdir


def use_compilation_cache(workdir: str) -> str | None:
    """JAX's persistent compilation cache in WORKDIR/compilation_cache. A cache directory
    the user set (JAX_COMPILATION_CACHE_DIR) is kept, JAX_ENABLE_COMPILATION_CACHE=false
    turns the cache off, and a workdir this process cannot write (a trained model in a
    read-only folder) gets none: JAX would warn at each program it could not save.
    Returns the directory in use, or None."""
    if jax.config.jax_compilation_cache_dir is None:
        if not _can_write(workdir):
            return None
        jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, FOLDER))
    return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache \
        else None


def _can_write(workdir: str) -> bool:
    """Whether this process may write in `workdir`, or create it (train.py creates it later:
    its nearest existing folder is asked then)."""
    path = os.path.abspath(workdir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
