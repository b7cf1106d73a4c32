"""Lowering for CUDA on any machine: the tests of the GPU's code paths read what JAX would
hand a GPU's compiler, without one."""

import jax


def lowered_for_cuda(fn, *args) -> str:
    """The StableHLO text of `jax.jit(fn)(*args)` lowered for CUDA. Where JAX asks which GPU
    Pallas's Triton kernels are for (0.12 without a GPU: their compute capability), it is
    lowered again for an abstract H100 (not always: JAX 0.10 then fails to lower a gather)."""
    def lower():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    try:
        return lower()
    except RuntimeError as error:
        if "No supported GPU devices found" not in str(error):
            raise
    device = jax.sharding.AbstractDevice("NVIDIA H100 80GB HBM3", None, "gpu")
    with jax.sharding.use_abstract_mesh(
            jax.sharding.AbstractMesh((1,), ("data",), abstract_device=device)):
        return lower()
