"""Where results will go, checked before the work that makes them: a folder or a file that
cannot be written is one clear error at the start, not a traceback after minutes of work.

    writable_folder("runs/x")                  # the absolute path, created
    writable_file("out/curves.png", "--output")  # the real path (a link: its target)

Both raise OutputPathError (a ValueError) naming the flag or setting. This module imports
nothing heavy: the plot command uses it without starting JAX.
"""

import os
import tempfile


class OutputPathError(ValueError):
    """A folder or file that results cannot be written to."""


def writable_folder(path: str, what: str = "--workdir") -> str:
    """`path` made absolute and created; an OutputPathError naming `what` unless it is a
    writable folder (a file is made and removed there: `os.access` says yes to root even
    on /proc)."""
    if not path:  # os.path.abspath("") is the current directory
        raise OutputPathError(f"{what} is empty (an unset shell variable?); name a folder")
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputPathError(f"{what} {path} is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise OutputPathError(f"{what} {path} is not a writable folder: "
                              f"{error.strerror or error}") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:  # /proc says "No such file or directory": say what failed
        raise OutputPathError(f"{what} {path} is not a writable folder: a file cannot be made "
                              f"there ({error.strerror or error})") from None
    return path


def writable_file(path: str, what: str) -> str:
    """The real path of a file to be written at `path` (a link to a file: its target, so the
    link stays), its folder created; an OutputPathError naming `what` unless the folder is
    writable and `path` is not a folder. A path that is neither a file nor a folder
    (/dev/stdout, a FIFO) is returned as it is: it is written straight to."""
    if not path:
        raise OutputPathError(f"{what} is empty (an unset shell variable?); name a file")
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        return path
    real = os.path.realpath(path)
    if os.path.isdir(real):
        raise OutputPathError(f"{what}={path} is a folder; give a file name")
    writable_folder(os.path.dirname(real), f"{what}'s folder")
    return real
