"""atomic_write: a file is written whole or not at all, and leaves no temporary behind."""

import json
import os
import signal
import stat
import subprocess
import sys

import numpy as np
import pytest

from transformer_jax.atomic_file import atomic_write, is_temporary, remove_temporaries


class Failed(Exception):
    pass


def test_writes_text_and_arrays(tmp_path):
    with atomic_write(tmp_path / "a.json", "w", encoding="utf-8") as f:
        json.dump({"ü": [1, 2]}, f)
    assert json.loads((tmp_path / "a.json").read_text(encoding="utf-8")) == {"ü": [1, 2]}
    ids = np.arange(1000, dtype=np.uint16)
    with atomic_write(tmp_path / "ids.npy") as f:
        np.save(f, ids)
    with atomic_write(tmp_path / "parts.npz") as f:
        np.savez(f, ids=ids, lengths=np.ones(1000, np.int64))
    np.testing.assert_array_equal(np.load(tmp_path / "ids.npy", mmap_mode="r"), ids)
    np.testing.assert_array_equal(np.load(tmp_path / "parts.npz")["ids"], ids)
    assert sorted(os.listdir(tmp_path)) == ["a.json", "ids.npy", "parts.npz"]


@pytest.mark.parametrize("before", [None, b"the old contents\n"])
def test_a_write_that_fails_midway_leaves_the_path_as_it_was(tmp_path, before):
    """A writer raising after writing half its data: the path keeps its old bytes (or stays
    absent), and no temporary file is left."""
    path = tmp_path / "data.bin"
    if before is not None:
        path.write_bytes(before)

    def chunks():
        yield b"x" * 100_000
        raise Failed("the generator failed")

    with pytest.raises(Failed):
        with atomic_write(path) as f:
            for chunk in chunks():
                f.write(chunk)
    assert (path.read_bytes() if path.exists() else None) == before
    assert os.listdir(tmp_path) == ([] if before is None else ["data.bin"])


def test_a_failing_np_save_leaves_nothing(tmp_path):
    """np.save of an object array without pickles fails after opening: nothing is left."""
    with pytest.raises(ValueError):
        with atomic_write(tmp_path / "a.npy") as f:
            np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=False)
    assert os.listdir(tmp_path) == []


def test_a_kill_midway_leaves_a_temporary_that_is_removed(tmp_path):
    """SIGKILL while writing: the path is absent, one temporary is left, and
    remove_temporaries removes it (and only the named file's, with a prefix)."""
    script = ("import os, signal, sys\nfrom transformer_jax.atomic_file import atomic_write\n"
              "with atomic_write(sys.argv[1]) as f:\n    f.write(b'half')\n    f.flush()\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model")],
                            timeout=60)
    assert result.returncode == -signal.SIGKILL
    (left,) = os.listdir(tmp_path)
    assert left.startswith("model.tmp-") and is_temporary(left)
    (tmp_path / "other.tmp-0123").write_bytes(b"")
    (tmp_path / "model.json").write_bytes(b"{}")
    assert remove_temporaries(tmp_path, "model") == [str(tmp_path / left)]
    assert sorted(os.listdir(tmp_path)) == ["model.json", "other.tmp-0123"]


def test_only_new_files_are_written():
    with pytest.raises(ValueError) as error:
        with atomic_write("anything", "ab"):
            pass
    assert str(error.value) == "atomic_write writes a new file: mode 'w' or 'wb', not 'ab'"


def test_the_bytes_reach_the_disk_before_the_name_and_the_name_after(tmp_path, monkeypatch):
    """fsync of the whole temporary file (its buffer flushed: all 5 bytes) while the path is
    still absent, then, the path there, fsync of the folder that holds the new name."""
    path = tmp_path / "a.bin"
    events = []
    real_fsync = os.fsync

    def fsync(descriptor):
        info = os.fstat(descriptor)
        kind = "folder" if stat.S_ISDIR(info.st_mode) else "file"
        events.append((kind, info.st_size if kind == "file" else info.st_ino, path.exists()))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    with atomic_write(path) as f:
        f.write(b"hello")
    assert events == [("file", 5, False), ("folder", os.stat(tmp_path).st_ino, True)]


def test_a_relative_path_is_written_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with atomic_write("a.txt", "w", encoding="utf-8") as f:
        f.write("hi")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "hi"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_ctrl_c_inside_the_block_leaves_no_temporary(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(tmp_path / "a.bin") as f:
            f.write(b"new")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["a.bin"] and (tmp_path / "a.bin").read_bytes() == b"old"


def test_a_temporary_is_known_by_its_file_name_not_its_folders(tmp_path):
    assert is_temporary("runs/model.json.tmp-0123")
    assert not is_temporary("runs/base.tmp-0123/model.json")
    for name in ("c.tmp-1", "a.tmp-1", "b.tmp-1", "b"):
        (tmp_path / name).write_bytes(b"")
    assert remove_temporaries(tmp_path) == [str(tmp_path / n) for n in ("a.tmp-1", "b.tmp-1",
                                                                        "c.tmp-1")]
    assert os.listdir(tmp_path) == ["b"]

