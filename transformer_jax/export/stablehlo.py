"""The stablehlo export: a run's searches lowered with `jax.export`, served by jax alone.

    OUT/params.npz                 the parameter leaves in `jax.tree.leaves` order, float32
                                   as trained, under keys that sort in that order (p0000, ...)
    OUT/greedy_b8_s16.jaxexport    one serialized `jax.export.Exported` per search and
    OUT/beam_b8_s16.jaxexport ...  bucket (B rows, S source tokens)
    OUT/export.json, OUT/tokenizer.model    (manifest.py)

Each artifact is `translate(params_leaves, inputs_BS) -> outputs_BT`, int32: `predict_step`
(encode, then the cached greedy or beam search) with max_length = S + max_extra_length (no
more than a learned position table's rows), the output length `predict.py` gives a batch
padded to S. predict.py pads to a multiple of 8 (`predict.BUCKET`), an export to its bucket:
where the buckets are those lengths the two give the same ids; elsewhere a translation that
reaches the limit without EOS (a runaway) runs longer in the export's longer bucket.
`serve_stablehlo.py` loads and calls them with numpy and jax only.

The parameters are an argument, not constants baked into the artifacts: one copy of the
weights serves every bucket and search (baked in, a base model would be stored once per
artifact), and another checkpoint of the same model is served by replacing params.npz.

Attention: "auto" picks an implementation for the backend it is traced on, and "cudnn"
lowers for NVIDIA GPUs only; the artifacts are lowered for several platforms at once, so
both are replaced with "xla", which lowers everywhere ("auto" picks it for float32 models
and on CPUs anyway), or, for a float16 model, with "reference", since XLA's CPU backend
cannot compile jax.nn's float16 attention (`attention.xla_unsupported`). A GPU then runs
XLA's attention (or the reference einsums), not cuDNN's fused kernel. Likewise a
run trained with the Pallas layer norm (Triton calls, which `jax.export` cannot promise to
load elsewhere) exports with Flax's, the same parameters and function.
"""

import dataclasses
import os

import jax
import numpy as np
import tqdm

from transformer_jax.attention import xla_unsupported
from transformer_jax.export.manifest import ExportError
from transformer_jax.predict import output_length, position_rows
from transformer_jax.steps import predict_step

PARAMS_FILE = "params.npz"
KNOWN_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
# Tried first when no platforms are given: lowering for a GPU needs none on this machine.
WANTED_PLATFORMS = ("cpu", "cuda")


def check_options(batch_sizes=(1, 8, 32), lengths=(16, 32, 64, 128), platforms=None) -> dict:
    """The options of `export_stablehlo`, as sorted tuples without repeats, or an ExportError
    naming the first that is wrong."""
    sizes = {}
    for name, given in (("batch_sizes", batch_sizes), ("lengths", lengths)):
        if isinstance(given, (int, np.integer)) and not isinstance(given, bool):
            given = (given,)  # one bucket
        if isinstance(given, (str, bytes)) or not hasattr(given, "__iter__"):
            raise ExportError(f"{name} must be a sequence of positive integers, got {given!r}")
        if not given or not all(_int_at_least(n, 1) for n in given):
            raise ExportError(f"{name} must be positive integers, got {list(given)}")
        sizes[name] = tuple(sorted({int(n) for n in given}))
    return {**sizes, "platforms": None if platforms is None else _checked_platforms(platforms)}


def export_stablehlo(trained, directory: str, *, search: dict, batch_sizes=(1, 8, 32),
                     lengths=(16, 32, 64, 128), platforms=None) -> dict:
    """Writes params.npz and an artifact per search and (batch size, length) bucket into
    `directory`; returns export.json's "stablehlo" entry as `{"stablehlo": {...}}`.

    `trained` is a `TrainedParams`; `search` the run's beam_size, alpha and
    max_extra_length. Searches: "greedy", and "beam" unless beam_size is 1. `platforms`
    None: ("cpu", "cuda") and this machine's where lowering for all of them works,
    else this machine's alone. A model with a learned position table encodes no source, and
    writes no output, longer than its rows: lengths above `config.max_length` become it, and
    outputs stop there too (`predict.output_length`), as with predict.py.
    """
    config = trained.model.config
    searches = _searches(search)
    options = check_options(batch_sizes, lengths, platforms)
    buckets = _buckets(options["batch_sizes"], options["lengths"], position_rows(config))
    platforms = options["platforms"]
    model = trained.model.clone(config=portable_config(trained.model.config))
    leaves, treedef = jax.tree.flatten(trained.params)
    _save_params(leaves, os.path.join(directory, PARAMS_FILE))
    specs = tuple(jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype) for leaf in leaves)
    jobs = [(name, b, s) for name in searches for b, s in buckets]
    for name, b, s in tqdm.tqdm(jobs, desc="exporting", unit="artifact"):
        settings = searches[name]
        max_length = output_length(config, s, settings["max_extra_length"])
        translate = _translate_fn(model, treedef, beam_size=settings["beam_size"],
                                  alpha=settings.get("alpha", 0.0), max_length=max_length)
        args = (specs, jax.ShapeDtypeStruct((b, s), np.int32))
        if platforms is None:
            platforms, exported = _lower_where_possible(translate, args)
        else:
            exported = jax.export.export(translate, platforms=platforms)(*args)
        bucket = {"batch_size": b, "length": s, "max_length": max_length,
                  "file": f"{name}_b{b}_s{s}.jaxexport"}
        with open(os.path.join(directory, bucket["file"]), "wb") as f:
            f.write(_serialized(exported))
        settings["buckets"].append(bucket)
    return {"stablehlo": {"params": PARAMS_FILE, "platforms": list(platforms),
                          "attention_implementation": model.config.attention_implementation,
                          "jax_version": jax.__version__, "searches": searches}}


def portable_config(config):
    """`config` with attention and layer norm implementations that lower on every platform
    (above), and no attention dropout: a search never applies it, and XLA's has none."""
    attention = config.attention_implementation
    if attention in ("auto", "cudnn", "xla"):  # XLA's, unless the CPU cannot compile it
        attention = "reference" if xla_unsupported(config.compute_dtype, backend="cpu") else "xla"
    return dataclasses.replace(config, attention_implementation=attention,
                               attention_dropout_rate=0.0, layer_norm_implementation="xla")


def _translate_fn(model, treedef, *, beam_size: int, alpha: float, max_length: int):
    """The jitted search of one bucket: (parameter leaves, inputs_BS) -> outputs_BT."""

    def translate(params_leaves, inputs_BS):
        params = jax.tree.unflatten(treedef, params_leaves)
        return predict_step(params, inputs_BS, model=model, beam_size=beam_size,
                            max_length=max_length, alpha=alpha)

    return jax.jit(translate)


def _lower_where_possible(translate, args):
    """(platforms, Exported): lowered for WANTED_PLATFORMS and this machine's, or, where
    jax cannot lower for one of them here, for this machine's alone."""
    here = jax.export.default_export_platform()
    wanted = tuple(dict.fromkeys((*WANTED_PLATFORMS, here)))
    try:
        return wanted, jax.export.export(translate, platforms=wanted)(*args)
    except Exception:  # noqa: BLE001 -- no cross-lowering here; a real error recurs below
        return (here,), jax.export.export(translate, platforms=(here,))(*args)


def _serialized(exported) -> bytes:
    try:
        return bytes(exported.serialize())
    except ImportError:  # jax's serialization needs the flatbuffers package
        raise ExportError("the stablehlo export needs the flatbuffers package "
                          "(pip install flatbuffers)") from None


def _save_params(leaves, path: str) -> None:
    """The leaves under keys that sort in their order: p0000, p0001, ..."""
    width = max(4, len(str(len(leaves) - 1)))
    np.savez(path, **{f"p{i:0{width}d}": np.asarray(jax.device_get(leaf))
                      for i, leaf in enumerate(leaves)})


def _searches(search: dict) -> dict:
    """{"greedy": {...}, "beam": {...}} with the settings each artifact needs; no "beam"
    when the run searches with one beam."""
    beam_size, extra = search["beam_size"], search["max_extra_length"]
    if not (_int_at_least(beam_size, 1) and _int_at_least(extra, 0)):
        raise ExportError(f"search needs a beam_size >= 1 and a max_extra_length >= 0, "
                          f"got {beam_size!r} and {extra!r}")
    beam_size, extra = int(beam_size), int(extra)
    searches = {"greedy": {"beam_size": 1, "max_extra_length": extra, "buckets": []}}
    if beam_size > 1:
        searches["beam"] = {"beam_size": beam_size, "alpha": float(search["alpha"]),
                            "max_extra_length": extra, "buckets": []}
    return searches


def _buckets(batch_sizes, lengths, longest: int | None) -> list[tuple[int, int]]:
    """Every (batch size, length) pair, ascending, with lengths no more than `longest` (None:
    any); the sizes are `check_options`'."""
    lengths = {min(s, longest or s) for s in lengths}
    return [(b, s) for b in batch_sizes for s in sorted(lengths)]


def _checked_platforms(platforms) -> tuple[str, ...]:
    platforms = (platforms,) if isinstance(platforms, str) else tuple(platforms)
    unknown = [p for p in platforms if p not in KNOWN_PLATFORMS]
    if unknown or not platforms:
        raise ExportError(f"platforms must be some of {', '.join(KNOWN_PLATFORMS)}, "
                          f"got {', '.join(platforms) or 'none'}")
    return platforms


def _int_at_least(n, minimum: int) -> bool:
    return isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= minimum
