"""compilation_cache.use_compilation_cache: which folder JAX's persistent cache uses, and its
damaged entries removed. (translate.py loading an earlier command's searches from it:
test_translation.py.)"""

import subprocess
import sys

import jax
import pytest
from jax._src.compilation_cache import compress_executable, decompress_executable

from transformer_jax.compilation_cache import drop_damaged_entries, use_compilation_cache


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
    """JAX writes an entry in place and never replaces one it finds: an entry a killed
    process left half written warned and was compiled again at every start, for good."""
    first = start(tmp_path)
    folder = tmp_path / "compilation_cache"
    entry = next(folder.glob("jit__lambda-*-cache"))
    whole, others = entry.read_bytes(), sorted(folder.glob("*-cache"))
    entry.write_bytes(whole[:len(whole) // 2])  # a process killed while JAX wrote it
    access_time = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
    access_time.write_bytes(b"\0" * 8)  # JAX_COMPILATION_CACHE_MAX_SIZE's companion file

    second = start(tmp_path)
    assert second.stdout == first.stdout
    assert f"{entry} is damaged" in second.stderr
    assert second.stderr.count("UserWarning") == 1  # the whole entries stay
    assert "Error reading persistent compilation cache entry" not in second.stderr
    assert not access_time.exists()
    assert sorted(folder.glob("*-cache")) == others
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


def test_the_sweep_keeps_what_decompresses_and_what_it_cannot_read(tmp_path):
    folder = tmp_path / "compilation_cache"
    folder.mkdir()
    (folder / "jit_whole-1-cache").write_bytes(compress_executable(b"an executable" * 100))
    (folder / "jit_short-2-cache").write_bytes(compress_executable(b"an executable" * 100)[:9])
    (folder / "jit_short-2-atime").write_bytes(b"\0" * 8)
    (folder / "other-file").write_bytes(b"not JAX's")
    with pytest.warns(UserWarning, match="jit_short-2-cache is damaged"):
        assert drop_damaged_entries(str(folder)) == ["jit_short-2-cache"]
    assert sorted(p.name for p in folder.iterdir()) == ["jit_whole-1-cache", "other-file"]
