"""compilation_cache.use_compilation_cache: which folder JAX's persistent cache uses, and its
damaged entries removed. (translate.py loading an earlier command's searches from it:
test_translation.py.)"""

import subprocess
import sys
import zlib

import jax
import pytest
from jax._src.compilation_cache import compress_executable, decompress_executable

from transformer_jax.compilation_cache import (ZSTD_FRAME, drop_damaged_entries,
                                               use_compilation_cache)


@pytest.fixture(autouse=True)
def jax_cache_flags():
    """Only JAX's flags change, restored after: nothing compiles here, so no cache opens."""
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache)
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_enable_compilation_cache", before[1])


def test_the_cache_is_the_workdirs_unless_the_user_chose_one(tmp_path):
    assert use_compilation_cache(str(tmp_path)) == f"{tmp_path}/compilation_cache"
    jax.config.update("jax_compilation_cache_dir", "/mine")  # JAX_COMPILATION_CACHE_DIR
    assert use_compilation_cache(str(tmp_path)) == "/mine"
    jax.config.update("jax_enable_compilation_cache", False)  # JAX_ENABLE_..._CACHE=false
    assert use_compilation_cache(str(tmp_path)) is None


def test_a_workdir_not_made_yet_gets_its_cache_and_none_is_created(tmp_path):
    """train.py's first start: the workdir is made later, by the trainer."""
    workdir = tmp_path / "runs" / "new"
    assert use_compilation_cache(str(workdir)) == f"{workdir}/compilation_cache"
    assert not (tmp_path / "runs").exists()


def test_a_workdir_that_cannot_be_written_gets_no_cache(tmp_path):
    """Under a regular file, nothing can be made: JAX would warn at every program."""
    (tmp_path / "file").write_text("")
    assert use_compilation_cache(str(tmp_path / "file" / "run")) is None
    assert jax.config.jax_compilation_cache_dir is None


# A command's start, as train.py's: the workdir's cache, then one program compiled and saved.
COMMAND = """
import sys, jax, jax.numpy as jnp
from transformer_jax.compilation_cache import use_compilation_cache
use_compilation_cache(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
print(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64)))[0, 0])
"""


def start(workdir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "always", "-c", COMMAND, str(workdir)],
                          capture_output=True, text=True, timeout=120, check=True)


def test_an_entry_cut_short_is_removed_at_the_next_start_and_saved_whole_again(tmp_path):
    """An entry a killed process left half written is removed by the next start, with one
    warning, and saved whole by its compilation; the whole entries are not touched, and JAX
    never meets the damaged one."""
    start(tmp_path)
    folder = tmp_path / "compilation_cache"
    entry = next(folder.glob("jit__lambda-*-cache"))
    whole = entry.read_bytes()
    entry.write_bytes(whole[:len(whole) // 2])  # a process killed while JAX wrote it
    access_time = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
    access_time.write_bytes(b"\0" * 8)  # JAX_COMPILATION_CACHE_MAX_SIZE's companion file
    others = {p: p.stat().st_mtime_ns for p in folder.glob("*-cache") if p != entry}
    assert others  # the programs of jnp.ones and of the indexing

    second = start(tmp_path)
    assert f"{entry} is damaged" in second.stderr
    assert second.stderr.count("-cache is damaged") == 1
    assert "Error reading persistent compilation cache entry" not in second.stderr
    assert not access_time.exists()
    assert {p: p.stat().st_mtime_ns for p in others} == others  # neither removed nor saved
    assert decompress_executable(entry.read_bytes())  # compiled and saved whole again

    third = start(tmp_path)
    assert "damaged" not in third.stderr and "Error reading" not in third.stderr


def test_only_the_workdirs_own_cache_is_swept(tmp_path):
    """A cache the user set (JAX_COMPILATION_CACHE_DIR, shared by runs) is left as it is."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "jit_f-0-cache").write_bytes(b"cut")
    jax.config.update("jax_compilation_cache_dir", str(mine))
    assert use_compilation_cache(str(tmp_path / "run")) == str(mine)
    assert (mine / "jit_f-0-cache").exists()


def test_the_sweep_removes_only_entries_in_jaxs_compression_that_do_not_decompress(tmp_path):
    """Whole entries stay; so do entries in the other compression (zstd or zlib, by the
    Python and packages that wrote them: another JAX's, under other keys), other files, and
    folders whose names end as entries do."""
    folder = tmp_path / "compilation_cache"
    folder.mkdir()
    executable = compress_executable(b"an executable" * 100)
    other = (zlib.compress(b"another JAX's" * 100) if executable.startswith(ZSTD_FRAME)
             else ZSTD_FRAME + b"another JAX's")
    (folder / "jit_whole-1-cache").write_bytes(executable)
    (folder / "jit_short-2-cache").write_bytes(executable[:9])
    (folder / "jit_short-2-atime").write_bytes(b"\0" * 8)
    (folder / "jit_empty-3-cache").write_bytes(b"")
    (folder / "jit_other-4-cache").write_bytes(other)
    (folder / "jit_folder-5-cache").mkdir()
    (folder / "other-file").write_bytes(b"not JAX's")
    with pytest.warns(UserWarning) as warned:
        assert drop_damaged_entries(str(folder)) == ["jit_empty-3-cache", "jit_short-2-cache"]
    assert [str(w.message).split(" is damaged")[0] for w in warned] == [
        f"{folder}/jit_empty-3-cache", f"{folder}/jit_short-2-cache"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "jit_folder-5-cache", "jit_other-4-cache", "jit_whole-1-cache", "other-file"]


def test_a_cache_turned_off_is_not_swept(tmp_path):
    """JAX_ENABLE_COMPILATION_CACHE=false: the workdir's cache is not used, so not touched."""
    (tmp_path / "compilation_cache").mkdir()
    (tmp_path / "compilation_cache" / "jit_f-0-cache").write_bytes(b"cut")
    jax.config.update("jax_enable_compilation_cache", False)
    assert use_compilation_cache(str(tmp_path)) is None
    assert (tmp_path / "compilation_cache" / "jit_f-0-cache").read_bytes() == b"cut"


def test_a_workdir_whose_name_holds_glob_characters_is_swept(tmp_path):
    """runs/base[2]: the folder's name is matched as it is, not as a pattern."""
    workdir = tmp_path / "base[2]"
    (workdir / "compilation_cache").mkdir(parents=True)
    (workdir / "compilation_cache" / "jit_f-0-cache").write_bytes(b"cut")
    with pytest.warns(UserWarning, match="jit_f-0-cache is damaged"):
        assert use_compilation_cache(str(workdir)) == f"{workdir}/compilation_cache"
    assert list((workdir / "compilation_cache").iterdir()) == []


def test_the_entries_removed_are_named_in_order(tmp_path):
    names = [f"jit_{c}-0-cache" for c in "zyxwvutsrqponmlkjihgfedcba"]
    for name in names:
        (tmp_path / name).write_bytes(b"cut")
    with pytest.warns(UserWarning) as warned:
        assert drop_damaged_entries(str(tmp_path)) == sorted(names)
    assert [str(w.message).split(" is damaged")[0] for w in warned] == [
        f"{tmp_path}/{name}" for name in sorted(names)]
