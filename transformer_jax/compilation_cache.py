"""JAX's persistent compilation cache in a run's folder, for the commands that compile.

    use_compilation_cache(workdir)   # first thing in main, before anything compiles

train.py calls it, so a resumed run loads its compiled steps instead of compiling them
again; evaluate.py and translate.py call it too, so each later command loads the
searches an earlier one compiled (one program per batch shape: predict.py).
"""

import contextlib
import glob
import os
import warnings

import jax

FOLDER = "compilation_cache"  # in the workdir
ENTRY, ACCESS_TIME = "-cache", "-atime"  # the suffixes of JAX's files for one program
ZSTD_FRAME = b"\x28\xb5\x2f\xfd"  # the magic number a zstd frame starts with (RFC 8878)


def use_compilation_cache(workdir: str) -> str | None:
    """JAX's persistent compilation cache in WORKDIR/compilation_cache, its damaged entries
    removed first (`drop_damaged_entries`). A cache directory the user set
    (JAX_COMPILATION_CACHE_DIR) is kept as it is, JAX_ENABLE_COMPILATION_CACHE=false turns
    the cache off, and a workdir this process cannot write (a trained model in a read-only
    folder) gets none: JAX would warn at each program it could not save.
    Returns the directory in use, or None."""
    if jax.config.jax_compilation_cache_dir is None:
        if not _can_write(workdir):
            return None
        folder = os.path.join(workdir, FOLDER)
        jax.config.update("jax_compilation_cache_dir", folder)
        if jax.config.jax_enable_compilation_cache:
            drop_damaged_entries(folder)
    return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache \
        else None


def drop_damaged_entries(folder: str) -> list[str]:
    """Removes each entry of JAX's cache in `folder` that this JAX writes and cannot
    decompress, with one warning each: an entry cut short by a process killed while JAX
    wrote it, or by a full disk. JAX writes an entry in place and never replaces one it
    finds, so such an entry would warn ("Error reading persistent compilation cache entry")
    and be compiled again at every later start; removed, the next compilation saves it
    whole. Entries in the other compression (zstd or zlib: another Python or JAX wrote
    them, under other keys) are left as they are. A process writing an entry meanwhile
    loses at most that entry. Returns the names removed."""
    try:  # JAX's own (de)compression: zstd or zlib, by the Python and packages installed
        from jax._src.compilation_cache import compress_executable, decompress_executable
    except ImportError:  # a JAX that moved them: JAX's own warnings stay the only sign
        return []
    ours = _compression(compress_executable(b""))
    removed = []
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), "*" + ENTRY))):
        try:
            with open(path, "rb") as f:
                entry = f.read()
        except OSError:  # removed by another process meanwhile, or not a file to read
            continue
        if _compression(entry) not in (ours, None):
            continue
        try:
            decompress_executable(entry)
        except MemoryError:
            raise
        except Exception as error:  # zlib.error or zstd's ZstdError, by JAX's compression
            # The access time first: a whole entry saved again meanwhile keeps its own
            # (with JAX_COMPILATION_CACHE_MAX_SIZE, JAX fails every save after an entry
            # without one).
            for file in (path.removesuffix(ENTRY) + ACCESS_TIME, path):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(file)
            warnings.warn(f"{path} is damaged ({error}); removed, so that its program "
                          f"is compiled and saved again")
            removed.append(os.path.basename(path))
    return removed


def _compression(entry: bytes) -> str | None:
    """The compression `entry` starts with the header of (RFC 8878, RFC 1950): "zstd",
    "zlib", or None."""
    if entry.startswith(ZSTD_FRAME):
        return "zstd"
    if len(entry) >= 2 and entry[0] & 0x0F == 8 and (entry[0] * 256 + entry[1]) % 31 == 0:
        return "zlib"
    return None


def _can_write(workdir: str) -> bool:
    """Whether this process may write in `workdir`, or create it (train.py creates it later:
    its nearest existing folder is asked then)."""
    path = os.path.abspath(workdir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
