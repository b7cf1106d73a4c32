"""What a benchmark ran on, and the most that hardware can do (its peak FLOP/s)."""

import functools
import os
import platform

import jax
import jax.numpy as jnp

from transformer_jax import provenance
from transformer_jax.benchmark.timing import median_seconds

# Dense peak TFLOP/s per chip from the vendors' datasheets (no sparsity), keyed by a part
# of JAX's `device_kind`. float32 on NVIDIA GPUs is the TF32 tensor-core rate: JAX's
# default float32 matmul precision uses TF32 there. TPUs have no separate float32 rate
# (float32 matmuls run as bfloat16 passes), so float32 has no peak there and no fraction
# is reported.
PEAK_TFLOPS = {
    "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0},
    "H100 NVL": {"bfloat16": 835.0, "float16": 835.0, "float32": 417.5},  # 1,671 sparse
    "H100": {"bfloat16": 989.0, "float16": 989.0, "float32": 494.5},  # SXM
    "H200 NVL": {"bfloat16": 835.0, "float16": 835.0, "float32": 417.5},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 494.5},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0},
    "TPU v4": {"bfloat16": 275.0},
    "TPU v5 lite": {"bfloat16": 197.0},  # v5e
    "TPU v5": {"bfloat16": 459.0},  # v5p: its device_kind is "TPU v5"
    "TPU v6 lite": {"bfloat16": 918.0},  # v6e (Trillium)
}


def device_kind() -> str:
    return jax.devices()[0].device_kind


def table_peak_tflops(kind: str, dtype: str) -> float | None:
    """The datasheet peak for a device kind ("NVIDIA H100 80GB HBM3") and dtype, if listed."""
    # The longest name first: "H100 PCIe" before "H100", "TPU v5 lite" before "TPU v5".
    for name in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if name.lower() in kind.lower():
            return PEAK_TFLOPS[name].get(dtype)
    return None


@functools.cache
def cpu_matmul_tflops(size: int = 2048, dtype: str = "float32") -> float:
    """The CPU's peak stand-in: a `size`² matmul's rate, measured now on this machine."""
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(jnp.matmul).lower(a, a).compile()
    seconds = median_seconds(lambda: matmul(a, a).block_until_ready(), warmup=2, iters=10,
                             traced=False)  # not in a --profile of the suite
    return 2 * size**3 / seconds / 1e12


def peak_tflops(dtype: str, *, quick: bool = False) -> tuple[float | None, str]:
    """(peak TFLOP/s, where it comes from) for this run's first device and `dtype`."""
    if jax.default_backend() == "cpu":
        size = 512 if quick else 2048
        # The matmul runs in float32 even for bfloat16 models: CPUs have no faster bf16 path.
        return cpu_matmul_tflops(size), f"measured: {size}x{size} float32 matmul"
    peak = table_peak_tflops(device_kind(), dtype)
    return peak, ("datasheet" if peak else f"no peak listed for {device_kind()!r}")


def summed_peak(peak: float | None, devices: int) -> float | None:
    """The peak of `devices` devices that share a step (an MFU's denominator): each
    accelerator's `peak` times their count; a CPU's, the host's matmul rate, as it is (its
    devices share its cores)."""
    return peak * devices if peak and jax.default_backend() != "cpu" else peak


def peak_note(dtype: str, *, quick: bool = False) -> str:
    """The notes' line of `dtype`'s peak (`peak_tflops`): its value, so that an MFU can be
    checked as TFLOP/s over it, and where it comes from."""
    peak, source = peak_tflops(dtype, quick=quick)
    return f"peak ({dtype}, for mfu): " + (f"{peak:.4g} TFLOP/s, " if peak else "") + source


def describe() -> dict:
    """The machine and software, for the JSON report."""
    return {
        "backend": jax.default_backend(),
        "device_kind": device_kind(),
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "processor": _processor(),
        "python": platform.python_version(),
        **provenance.software("torch", "ctranslate2"),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def _processor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
