"""Strict JAX for every test, and 8 simulated CPU devices for the multi-device ones.

XLA_FLAGS must be set before JAX starts, so this runs before any test imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
# No implicit dtype promotion (int with float, bfloat16 with float32): every mix is a cast
# written in the code. Library internals that mix run under "standard": the package's
# calls of optax's Adam and jax.nn's XLA attention, and the tests below that use the
# `standard_dtype_promotion` fixture. On a GPU, where the cuDNN and bfloat16 paths
# have not been run strict, promotion stays standard.
if jax.default_backend() == "cpu":
    jax.config.update("jax_numpy_dtype_promotion", "strict")
# Full float32 matmuls on GPUs too (TF32 would break the 1e-5 tolerances).
jax.config.update("jax_default_matmul_precision", "highest")

# Datasets the tests build (the small "numbers") go to a scratch directory, not
# ~/tensorflow_datasets: one per process, since pytest-xdist workers would otherwise
# race to build the same dataset. TFDS reads the variable when it is imported.
if os.environ.get("TFDS_DATA_DIR") in (None, os.environ.get("TRANSFORMER_JAX_TEST_TFDS_DIR")):
    import tempfile

    os.environ["TFDS_DATA_DIR"] = tempfile.mkdtemp(prefix="tfds-tests-")
    os.environ["TRANSFORMER_JAX_TEST_TFDS_DIR"] = os.environ["TFDS_DATA_DIR"]


@pytest.fixture
def standard_dtype_promotion():
    """JAX's standard dtype promotion for one test: for tests that call optax's Adam
    directly (it raises a float to its int32 step count) or run Flax's LayerNorm in
    bfloat16 (it mixes bfloat16 and float32 inside)."""
    with jax.numpy_dtype_promotion("standard"):
        yield
