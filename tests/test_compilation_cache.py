"""compilation_cache.use_compilation_cache: which folder JAX's persistent cache uses.
(translate.py loading an earlier command's searches from it: test_translation.py.)"""

import jax
import pytest

from transformer_jax.compilation_cache import use_compilation_cache


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
