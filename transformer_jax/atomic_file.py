"""Files written whole or not at all: a crash, a kill or a power cut leaves the old file or
the new one under the name, never a part of one.

    with atomic_write("runs/x/record.json", "w") as f:   # f: a new temporary file beside it
        json.dump(record, f)     # an exception here leaves the path as it was, no temporary
    # here the path holds the whole new file, on disk

    with atomic_write("ids.npy") as f:
        np.save(f, ids)          # np.save and np.savez take the open file

The recipe: write a temporary file in the same folder (so the rename stays within one file
system), flush it and `os.fsync` it (its bytes reach the disk before its name does),
`os.replace` it over the path (atomic on POSIX), then fsync the folder (the new name
survives a power cut). Without the fsyncs, a power cut soon after the rename can leave an
empty or short file under the new name: the rename reached the disk, the data had not.

A kill (SIGKILL) inside the block leaves its temporary file behind, never the path: a
writer that owns a folder removes such leftovers with `remove_temporaries`.
"""

import contextlib
import os
import uuid

TEMPORARY_MARK = ".tmp-"  # "{path}.tmp-{32 hex digits}"


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", **open_kwargs):
    """Yields a new file open for writing (`mode` "wb" or "w", `open`'s keywords such as
    encoding); when the block ends without an exception, its contents replace `path`, whole
    and on disk. When the block raises, `path` is left as it was and the file is removed."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes a new file: mode 'w' or 'wb', not {mode!r}")
    path = os.fspath(path)
    temporary = f"{path}{TEMPORARY_MARK}{uuid.uuid4().hex}"
    try:
        with open(temporary, mode.replace("w", "x"), **open_kwargs) as f:  # "x": never shared
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    sync_folder(os.path.dirname(os.path.abspath(path)))


def sync_folder(folder: str | os.PathLike) -> None:
    """Flushes `folder`'s entries (names created, renamed or removed in it) to the disk."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def is_temporary(name: str) -> bool:
    """Whether `name` is a temporary file of `atomic_write` (left by a kill if it is still
    there when no write is under way)."""
    return TEMPORARY_MARK in os.path.basename(name)


def remove_temporaries(folder: str | os.PathLike, prefix: str = "") -> list[str]:
    """Removes the temporary files that kills left in `folder` (only those of files whose
    names start with `prefix`); returns their paths. Only for a folder no other process is
    writing into: a write under way there would lose its temporary file."""
    removed = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(prefix) and is_temporary(name):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
    return removed
