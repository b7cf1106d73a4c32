"""Data parallelism, the only module that knows about devices.

Two strategies run the same pure steps of `steps.py`:

    "pmap"     jax.pmap over this process's devices; the steps sum across all
               devices of all processes with lax.psum over the axis "batch" (where
               there are several: a sum over one device is no sum).
    "sharded"  jax.jit on a Mesh of every device with one axis "data": the batch
               is split along it, parameters are replicated, XLA adds the sums.

Either way each process feeds the rows it read itself (its data shard).
"""

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.run_config import STRATEGIES

AXIS = "batch"  # the pmap axis name the steps sum over
# XLA's CPU backend copies many arrays of the donated state at the start of the `sharded`
# step (base: 146 of them) unless its copy insertion analyses the program by region, an
# option it leaves off: with it none, and 1.04-1.10 x the base step in three runs (2-core
# Intel Xeon VM, 2026-11-30; BENCHMARKS.md, "model: copy insertion by region"). Under pmap
# it gave 0.98-1.01 x, so pmap's step goes without; GPUs have a copy insertion of their own.
CPU_REGION_ANALYSIS = {"xla_cpu_copy_insertion_use_region_analysis": True}


class Parallel:
    """Places state and batches, and compiles steps, for one strategy."""

    def __init__(self, strategy: str, devices=None):
        """`devices`: every device of the run (default `jax.devices()`, the default backend's);
        e.g. `jax.devices("cpu")` to run on the host's CPUs beside a GPU."""
        if strategy not in STRATEGIES:
            raise ValueError(f"parallelism must be one of {STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        devices = list(jax.devices() if devices is None else devices)
        self._local_devices = [d for d in devices if d.process_index == jax.process_index()]
        self.num_local_devices = len(self._local_devices)
        self._on_cpu = devices[0].platform == "cpu"
        # A plain Mesh has Auto axes; jax.make_mesh's Explicit axes would reject
        # batches and parameters placed without explicit shardings.
        self.mesh = Mesh(np.array(devices), ("data",))
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        self._split = NamedSharding(self.mesh, PartitionSpec("data"))
        # pmap's layout: a copy per local device along a leading axis, named like pmap's
        # outputs, so that step 2 does not compile again for another sharding.
        self._copies = NamedSharding(Mesh(np.array(self._local_devices), (AXIS,)),
                                     PartitionSpec(AXIS))

    def put_state(self, state):
        """One copy of the state, as the compiled steps want it placed."""
        if self.strategy == "pmap":
            return jax.tree.map(self._copy_to_each_device, state)
        return jax.device_put(state, self._replicated)

    def _copy_to_each_device(self, x):
        # From one host copy, compiling nothing. flax.jax_utils.replicate stacks the copies
        # on the first device, all of them there at once, with a program compiled per
        # shape: the tiny model's state took 2.2 s on a 2-core CPU, this 0.1 s.
        host = np.asarray(jax.device_get(x))
        return jax.device_put(np.broadcast_to(host, (len(self._local_devices), *host.shape)),
                              self._copies)

    def get_state(self, placed):
        """One copy of a placed state on the host (numpy arrays), e.g. to save it."""
        if self.strategy == "pmap":  # the first local device's copy, nothing compiled
            return jax.tree.map(lambda x: np.asarray(x.addressable_data(0))[0, ...], placed)
        return jax.device_get(placed)

    def local_params(self, placed_state):
        """One copy of the parameters on this process's first device (for searches run here),
        single-device arrays as restored ones are: training's BLEU searches then compile to
        the programs evaluate.py's do, and WORKDIR/compilation_cache serves both."""
        def first_copy(x):
            # Not flax's unreplicate: on one device its arrays lie on a one-device mesh,
            # and a search of them compiles to another program than of restored ones.
            shard = x.addressable_data(0)
            return shard.reshape(shard.shape[1:]) if self.strategy == "pmap" else shard

        return jax.tree.map(first_copy, placed_state.params)

    def put_batch(self, batch):
        """This process's rows (numpy, leading axis B) as the step's input."""
        rows = next(iter(batch.values())).shape[0]
        if rows % self.num_local_devices:
            raise ValueError(f"{rows} rows per process do not split over "
                             f"{self.num_local_devices} local devices")
        if self.strategy == "pmap":
            return jax.tree.map(
                lambda x: x.reshape((self.num_local_devices, -1) + x.shape[1:]), batch)
        return jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(self._split, x), batch)

    def compile_train_step(self, step_fn, compiler_options: dict | None = None):
        """`step_fn(state, batch, axis_name=...)` compiled; the state's buffers are donated.
        `compiler_options` are XLA's, e.g. `profiling.TRACEABLE`. `jax.pmap` takes none, so
        in one process its step runs under a jit that takes them: the same program, since
        pmap's arguments there are already whole. In several processes pmap turns each
        process's rows into global arrays outside its jit, so there its step compiles
        without them. On CPUs the `sharded` step compiles with `CPU_REGION_ANALYSIS` too,
        unless `compiler_options` set it."""
        if self.strategy == "pmap":
            pmapped = jax.pmap(functools.partial(step_fn, axis_name=AXIS), axis_name=AXIS,
                               devices=self._pmap_devices(), donate_argnums=(0,))
            if not compiler_options or jax.process_count() > 1:
                return pmapped

            # Not jax.jit(pmapped): its .lower() names another module than the one it
            # runs, and a profile matches the trace's module to the program's text.
            def step(state, batch):
                return pmapped(state, batch)

            return jax.jit(step, donate_argnums=(0,), compiler_options=compiler_options)
        options = dict(_cpu_region_analysis() if self._on_cpu else {}, **(compiler_options or {}))
        return jax.jit(functools.partial(step_fn, axis_name=None), donate_argnums=(0,),
                       compiler_options=options or None)

    def compile_eval_step(self, step_fn):
        """`step_fn(params, batch, axis_name=...)` compiled; returns summed metrics."""
        if self.strategy == "pmap":
            return jax.pmap(functools.partial(step_fn, axis_name=AXIS), axis_name=AXIS,
                            devices=self._pmap_devices())
        return jax.jit(functools.partial(step_fn, axis_name=None))

    def _pmap_devices(self):
        """pmap's `devices` (every process's): None for the default, which pmap prefers."""
        devices = list(self.mesh.devices.flat)
        return None if devices == jax.devices() else devices

    def to_host(self, metrics) -> dict[str, float]:
        """Summed metrics (equal on every device) as Python floats; this waits for them."""
        if self.strategy == "pmap":
            metrics = jax.tree.map(lambda x: x.addressable_data(0), metrics)
        return {name: float(value.item()) for name, value in jax.device_get(metrics).items()}


@functools.cache
def _cpu_region_analysis() -> dict:
    """`CPU_REGION_ANALYSIS` where this jaxlib's XLA knows the option (it refuses an unknown
    one when compiling; asked once, on a CPU program of one addition), else none."""
    cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    try:
        jax.jit(lambda x: x + 1, compiler_options=CPU_REGION_ANALYSIS).lower(
            jax.ShapeDtypeStruct((), np.float32, sharding=cpu)).compile()
    except jax.errors.JaxRuntimeError:  # INVALID_ARGUMENT: No such compile option
        return {}
    return CPU_REGION_ANALYSIS
