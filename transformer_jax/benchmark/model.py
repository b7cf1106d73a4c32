"""The `model` suite: the whole train step (forward, backward, Adam) per preset and strategy.

Random token ids, the paper's optimizer and label smoothing. CPUs time full rows
(no padding); accelerators time rows packed as the pipeline packs them (examples
of 5-59 tokens, segment masks, about 5 % padding at the end of each row).
Target tokens/s = B·T / the median step time (on accelerators, 5 steps queued back to
back per timed run, as train.py queues them); `real_tokens_per_sec` counts only
the non-padding target tokens. MFU is `train_step_flops` (flops.py) per second
over the device peak (on CPUs, the matmul rate measured in the same run), with
and without the FLOPs of softmax(Q Kᵀ) V itself.
"""

import contextlib
import dataclasses
import functools
import itertools
import time

import jax
import tqdm
import numpy as np

from transformer_jax import train_state
from transformer_jax.benchmark import report
from transformer_jax.benchmark.flops import train_step_flops
from transformer_jax.benchmark.machine import peak_note, peak_tflops, summed_peak
from transformer_jax.benchmark.timing import (MEMORY_NOTE, SPREAD_NOTE, back_to_back,
                                               compile_seconds, memory_bytes, timed_seconds,
                                               traced_as)
from transformer_jax.layer_norm import add_layer_norm
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig, get_model_config
from transformer_jax.optim import make_optimizer
from transformer_jax.parallel import Parallel
from transformer_jax.run_config import STRATEGIES
from transformer_jax.steps import train_step
from transformer_jax.train_state import create_train_state

XLA_PREFIX = "xla_"  # --vary's names of XLA's options, as XLA_FLAGS names them
JAX_PREFIX = "jax_"  # --vary's names of JAX's own options, as jax.config names them


@dataclasses.dataclass(frozen=True)
class Case:
    """A model and the batch it is timed on: `batch` rows of `length` source and target tokens."""

    name: str
    config: ModelConfig
    batch: int
    length: int


def model_configs() -> dict[str, ModelConfig]:
    """The presets, plus "small": a model a laptop trains (the compare suite's second size)."""
    return {
        "tiny": get_model_config("tiny"),
        # Not a preset: d_model 256, 4 heads, d_ff 1024, 3 layers; V = 8000, the size of a
        # SentencePiece vocabulary for a corpus of a few million words.
        "small": get_model_config("base", vocab_size=8000, d_model=256, num_heads=4, d_ff=1024,
                                  num_layers=3),
        "base": get_model_config("base"),
        "big": get_model_config("big"),
    }


def cases(quick: bool) -> list[Case]:
    """CPUs get short rows and no big model (a step takes seconds there, and the suite should
    take minutes); accelerators get the paper's batch: 96 rows of 256 tokens, about 25k
    target tokens (§5.1), for base and big."""
    configs = model_configs()
    if quick:
        return [Case("tiny", configs["tiny"], 8, 16)]
    if jax.default_backend() == "cpu":
        sizes = {"tiny": (16, 32), "small": (16, 32), "base": (8, 32)}
    else:
        sizes = {"base": (96, 256), "big": (96, 256)}
    return [Case(name, configs[name], *shape) for name, shape in sizes.items()]


def synthetic_batch(config: ModelConfig, batch: int, length: int, seed: int = 0) -> dict:
    """Full rows of random ids in [4, V): no padding, no packing (numpy, like the pipeline's)."""
    rng = np.random.default_rng(seed)
    low = min(4, config.vocab_size - 1)
    return {key: rng.integers(low, config.vocab_size, (batch, length), dtype=np.int32)
            for key in ("inputs", "targets")}


def packed_segments_BT(rng, batch: int, length: int, sizes=(5, 60), fill=0.95) -> np.ndarray:
    """Segment ids 1, 2, ... of examples of sizes[0]..sizes[1]-1 tokens packed into each row
    until `fill` of it is used; 0 (padding) after them."""
    segments = np.zeros((batch, length), np.int32)
    for row in range(batch):
        used, segment = 0, 0
        while (size := int(rng.integers(*sizes))) + used <= int(length * fill):
            segment += 1
            segments[row, used:used + size] = segment
            used += size
    return segments


def packed_batch(config: ModelConfig, batch: int, length: int, seed: int = 0) -> dict:
    """Random ids in packed rows, with the segment ids and the positions (restarting at each
    example) of the pipeline's packed batches; the same segments for source and target."""
    rows = synthetic_batch(config, batch, length, seed)
    segments = packed_segments_BT(np.random.default_rng(seed), batch, length)
    starts = np.maximum.accumulate(np.where(np.diff(segments, prepend=-1) != 0,
                                            np.arange(length)[None], 0), axis=1)
    positions = ((np.arange(length)[None] - starts) * (segments != 0)).astype(np.int32)
    real = segments != 0
    return {"inputs": rows["inputs"] * real, "targets": rows["targets"] * real,
            "inputs_segmentation": segments, "targets_segmentation": segments,
            "inputs_positions": positions, "targets_positions": positions}


def train_setup(config: ModelConfig, strategy: str, batch: dict, loss_chunk_size: int = 0,
                xla_options: dict | None = None, devices=None):
    """(compiled step, placed state, placed batch, compile seconds, state seconds) as the
    trainer runs them, on `devices` (default: every device); `xla_options` are XLA's
    compiler options for this step alone."""
    parallel = Parallel(strategy, devices)
    model = Transformer(config)
    optimizer = make_optimizer(d_model=config.d_model)
    state, state_s = fresh_state(parallel, model, optimizer.tx)
    step_fn = functools.partial(train_step, model=model, seed=0, label_smoothing=0.1,
                                learning_rate_fn=optimizer.learning_rate_fn,
                                loss_chunk_size=loss_chunk_size)
    placed = parallel.put_batch(batch)
    step, seconds = compile_seconds(parallel.compile_train_step(step_fn), state, placed,
                                    compiler_options=xla_options)
    return step, state, placed, seconds, state_s


def fresh_state(parallel: Parallel, model: Transformer, tx) -> tuple:
    """(the state placed on the devices, seconds): a fresh train.py's state, its parameters'
    program compiled afresh (`create_train_state` keeps it per model in a process; a row
    of the same model would read it), run, the optimizer's state built and all placed."""
    train_state._compiled_init_params.clear_cache()
    start = time.perf_counter()
    state = jax.block_until_ready(
        parallel.put_state(create_train_state(model, tx, jax.random.key(0))))
    return state, time.perf_counter() - start


def compiled_step(case: Case, dtype: str, strategy: str, *, quick: bool, packed: bool,
                  loss_chunk_size: int = 0, fields: dict | None = None, devices=None):
    """(config, batch, compiled step, compile seconds, state seconds, `run_once`):
    `run_once` queues `queued_steps(quick)` steps back to back, each on the state the last
    one left, and waits for the last (for `median_seconds`; divide by the steps). `fields`
    as in `time_train_step`; JAX's options among them are the caller's to set
    (`jax_options`), around this call and the timed ones."""
    model_fields, xla_options, _ = split_fields(fields or {})
    config = dataclasses.replace(case.config, dtype=dtype, **model_fields)
    batch = (packed_batch if packed else synthetic_batch)(config, case.batch, case.length)
    step, state, placed, compile_s, state_s = train_setup(config, strategy, batch,
                                                          loss_chunk_size, xla_options, devices)
    holder = [state]

    def one_step():
        holder[0], metrics = step(holder[0], placed)
        return metrics

    return (config, batch, step, compile_s, state_s,
            back_to_back(one_step, queued_steps(quick)))


def time_train_step(case: Case, dtype: str, strategy: str, *, quick: bool,
                    packed: bool | None = None, loss_chunk_size: int = 0,
                    fields: dict | None = None, devices=None) -> dict:
    """One row; `packed` rows by default on accelerators, full rows on CPUs;
    `loss_chunk_size` as `train_step`'s (0: the whole logits); `fields` replace the case's
    `ModelConfig` fields, or set XLA's options where named `xla_...`, or JAX's where named
    `jax_...` (and are columns of the row)."""
    fields = fields or {}
    packed = jax.default_backend() != "cpu" if packed is None else packed
    label = "-".join([case.name, dtype, strategy, f"loss_chunk={loss_chunk_size}"]
                     + [f"{name}={value}" for name, value in fields.items()])
    with jax_options(split_fields(fields)[2]):
        config, batch, step, compile_s, state_s, run_once = compiled_step(
            case, dtype, strategy, quick=quick, packed=packed,
            loss_chunk_size=loss_chunk_size, fields=fields, devices=devices)
        with traced_as(label, step):  # --profile: each case's trace beside its program
            timed = timed_seconds(run_once, warmup=1 if quick else 2, iters=3 if quick else 10)
    seconds = timed.median / queued_steps(quick)
    flops = train_step_flops(config, case.batch, case.length, case.length)
    matmuls = train_step_flops(config, case.batch, case.length, case.length, attention=False)
    count = len(devices or jax.devices())
    peak = summed_peak(peak_tflops(dtype, quick=quick)[0], count)
    tflops = flops / seconds / 1e12
    return {"model": case.name, "dtype": dtype, "strategy": strategy, "devices": count,
            "batch": case.batch,
            "length": case.length, "rows": "packed" if packed else "full",
            "loss_chunk": loss_chunk_size, **fields,
            "step_ms": seconds * 1e3, **timed.columns(),
            "tokens_per_sec": case.batch * case.length / seconds,
            "real_tokens_per_sec": int(np.count_nonzero(batch["targets"])) / seconds,
            "compile_s": compile_s, "state_s": state_s, "tflops": tflops,
            "mfu": tflops / peak if peak else None,
            "mfu_no_attention": matmuls / seconds / 1e12 / peak if peak else None,
            "memory_bytes": memory_bytes(step)}


def queued_steps(quick: bool) -> int:
    """Steps queued back to back per timed run on accelerators, as train.py queues them.
    Waiting for each step's metrics before dispatching the next leaves the device idle
    while the host dispatches: on an H200 (2026-11-26), train.py ran 27.5 steps/s of 97
    rows where this suite, then waiting after each step, timed 25.1 of 96. One on CPUs,
    where a step is long enough that dispatch does not show."""
    return 1 if quick or jax.default_backend() == "cpu" else 5


def parse_vary(texts) -> dict[str, tuple]:
    """{"dropout_bits": (32, 16)} from ["dropout_bits=32,16"] (the CLI's --vary): each a
    `ModelConfig` field and values of its type, or one of XLA's options (a name that starts
    with `xla_`, as XLA_FLAGS names it: true/false, a number or text), or one of JAX's own
    (`jax_...`, as `jax.config` names it); values are separated by semicolons instead where
    one holds a comma (`_values`). A ValueError names what is wrong."""
    types = {f.name: f.type for f in dataclasses.fields(ModelConfig)}
    vary = {}
    for text in texts:
        name, equals, values = text.partition("=")
        if name in vary:
            raise ValueError(f"--vary {name} is given twice; give its values once: "
                             f"{name}=V1,V2,...")
        if name.startswith(XLA_PREFIX) and equals:
            vary[name] = tuple(xla_option(name, v) for v in _values(values))
            continue
        if name.startswith(JAX_PREFIX) and equals:
            vary[name] = tuple(jax_option(name, v) for v in _values(values))
            continue
        if name not in types or name in ("dtype", "vocab_size") or not values:
            raise ValueError(f"--vary takes FIELD=V1,V2,... with a ModelConfig field other than "
                             f"dtype (--dtypes) and vocab_size, or one of XLA's options "
                             f"(xla_...) or JAX's (jax_...), got "
                             f"{text!r}; fields: "
                             f"{', '.join(n for n in types if n not in ('dtype', 'vocab_size'))}")
        vary[name] = tuple(_field_value(types[name], name, v) for v in _values(values))
    return vary  # `chosen_cases` checks each combination against ModelConfig's own rules


def _values(text: str) -> list[str]:
    """The values of one --vary, stripped: "a,b" gives [a, b]; where there is a semicolon,
    semicolons separate them, for values that hold commas ("A,B;C" gives ["A,B", "C"], and
    "A,B;" the one value "A,B"); "" is the one value "" (an XLA option set to nothing)."""
    if ";" not in text:
        return [value.strip() for value in text.split(",")]
    values = text.split(";")
    return [value.strip() for value in (values[:-1] if not values[-1].strip() else values)]


def split_fields(fields: dict) -> tuple[dict, dict, dict]:
    """(`ModelConfig` fields, XLA's options, JAX's options) of one variant of `--vary`."""
    xla = {name: value for name, value in fields.items() if name.startswith(XLA_PREFIX)}
    jax_ = {name: value for name, value in fields.items() if name.startswith(JAX_PREFIX)}
    model = {name: value for name, value in fields.items() if name not in xla | jax_}
    return model, xla, jax_


def jax_option(name: str, text: str):
    """`text` as the value of JAX's option `name` (`jax.config`'s name): true/false where it
    is a bool, an integer where an int, else the text; checked by setting it, then setting
    back the one in force. A ValueError names an option JAX does not have, or JAX's refusal."""
    try:
        current = getattr(jax.config, name)
    except AttributeError:
        raise ValueError(f"--vary {name}: JAX has no such option (as jax.config names "
                         f"them)") from None
    kind = type(current) if isinstance(current, (bool, int)) else str
    value = _field_value(kind, name, text)
    try:
        with jax_options({name: value}):
            pass
    except (ValueError, TypeError) as error:
        raise ValueError(f"--vary {name}={text}: JAX refuses it: {error}") from None
    return value


@contextlib.contextmanager
def jax_options(options: dict):
    """JAX's `options` in force inside, the ones before restored after (one variant of
    `--vary`'s, set while its programs are traced, compiled and timed)."""
    before = {name: getattr(jax.config, name) for name in options}
    try:
        for name, value in options.items():
            jax.config.update(name, value)
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)


def xla_option(name: str, text: str):
    """`text` as the value XLA's option `name` takes, checked by compiling a one-line program
    with it: XLA types each value strictly (it refuses "true" for a bool and 1 for a float),
    so the first of true/false, an integer, a float and the text itself that XLA accepts;
    else a ValueError in XLA's words (an option it does not have, a value of another type).
    The trial compilation does what the option does (`xla_dump_to` dumps the one-line
    program); an option XLA reads only when its client starts is accepted and does nothing
    per program."""
    candidates = [text.lower() == "true"] if text.lower() in ("true", "false") else []
    for kind in (int, float):
        try:
            candidates.append(kind(text))
        except ValueError:
            pass
    for value in candidates + [text]:
        try:
            jax.jit(lambda x: x + 1).lower(np.float32(0)).compile(
                compiler_options={name: value})
            return value
        except jax.errors.JaxRuntimeError as error:
            refused = str(error)
            if "No such compile option" in refused:
                break
    raise ValueError(f"--vary {name}={text}: XLA refuses it: {refused}")


def _field_value(kind: type, name: str, text: str):
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"--vary {name}= takes true or false, got {text!r}")
        return text.lower() == "true"
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"--vary {name}= takes {kind.__name__} values, got {text!r}") from None


def default_strategies() -> tuple[str, ...]:
    """Both strategies, except on a single accelerator, where only `sharded` is timed (an
    accelerator's time is scarce). The programs differ there too: pmap runs its function
    on blocks of shape (1, ...), which costs base 1.14-1.16 x on one CPU device ("model:
    pmap on one device without its sum" in BENCHMARKS.md); on an H200 train.py's pmap
    steps took 36.3 ms where this suite's `sharded` step took 35.1-36.1 ms."""
    one_accelerator = jax.default_backend() != "cpu" and jax.device_count() == 1
    return ("sharded",) if one_accelerator else STRATEGIES


def chosen_cases(quick: bool, models=None, vary: dict | None = None):
    """(the cases of `models`, the dicts of field values of `vary`), every combination
    checked before anything is timed: a ValueError names a model this backend does not
    time or a combination `ModelConfig` refuses."""
    names = [case.name for case in cases(quick)]
    if unknown := [name for name in models or () if name not in names]:
        raise ValueError(f"no model {', '.join(unknown)} here; this backend times "
                         f"{', '.join(names)}" + (" with --quick" if quick else ""))
    chosen = [case for case in cases(quick) if models is None or case.name in models]
    variants = combinations(vary)
    for case, fields in itertools.product(chosen, variants):
        try:
            dataclasses.replace(case.config, **split_fields(fields)[0])
        except ValueError as error:
            raise ValueError(f"{case.name} with {fields}: {error}") from None
    if any(fields.get("layer_norm_implementation") == "tokamax" for fields in variants):
        _run_tokamax_layer_norm()
    return chosen, variants


def combinations(vary: dict | None) -> list[dict]:
    """Every combination of `vary`'s values, one dict each ([{}] without `vary`)."""
    vary = vary or {}
    return [dict(zip(vary, values)) for values in itertools.product(*vary.values())]


def _run_tokamax_layer_norm() -> None:
    """tokamax's layer norm once, on 2 rows of 8: a tokamax missing, or one that cannot run
    its kernel here (tokamax 0.0.17 with jax-triton 0.3.1, on a GPU), is a ValueError before
    the other variants are timed, not after."""
    x_RD = np.ones((2, 8), np.float32)
    add_layer_norm(x_RD, x_RD, np.ones(8, np.float32), np.zeros(8, np.float32), epsilon=1e-6,
                   implementation="tokamax")


def default_dtypes(quick: bool) -> tuple[str, ...]:
    """float32 on CPUs (bfloat16 beside it); bfloat16 alone on accelerators, how they train."""
    if quick:
        return ("float32",)
    return ("float32", "bfloat16") if jax.default_backend() == "cpu" else ("bfloat16",)


def default_loss_chunks(quick: bool) -> tuple[int, ...]:
    """The whole logits (0) and, on accelerators (and in --quick, to run the path), the
    output layer and loss in chunks of target tokens (`output_loss.py`)."""
    if quick:
        return (0, 64)
    return (0,) if jax.default_backend() == "cpu" else (0, 4096)


def run(quick: bool = False, *, models=None, dtypes=None, strategies=None,
        loss_chunks=None, vary: dict | None = None) -> tuple[list[dict], list[str]]:
    """(one row per model × dtype × strategy × loss chunk × varied fields, notes); `models`
    picks among `cases(quick)`; `vary` maps `ModelConfig` fields, or XLA's options, to the
    values to time, e.g. {"dropout_bits": (32, 16, 8)}, one after another in this process."""
    dtypes = dtypes or default_dtypes(quick)
    strategies = strategies or default_strategies()
    loss_chunks = loss_chunks or default_loss_chunks(quick)
    chosen, variants = chosen_cases(quick, models, vary)
    grid = [(case, dtype, strategy, chunk, fields) for case in chosen for dtype in dtypes
            for strategy in strategies for chunk in loss_chunks for fields in variants]
    rows = [report.measured(time_train_step(case, dtype, strategy, quick=quick,
                                            loss_chunk_size=chunk, fields=fields))
            for case, dtype, strategy, chunk, fields in tqdm.tqdm(grid, desc="model",
                                                                   disable=quick)]
    peaks = [peak_note(dtype, quick=quick) for dtype in dict.fromkeys(r["dtype"] for r in rows)]
    return rows, [*peaks, "tokens_per_sec: target tokens (B·T) per second",
                  "real_tokens_per_sec: non-padding target tokens per second",
                  "loss_chunk: target tokens per chunk of the output layer and loss "
                  "(output_loss.py); 0: the whole (B, T, V) logits",
                  "state_s: seconds building a fresh train.py's state: its parameters' "
                  "program compiled and run, the optimizer's state, placed on the devices",
                  "tflops, mfu: train_step_flops() in transformer_jax/benchmark/flops.py; "
                  "mfu_no_attention leaves out softmax(Q Kᵀ) V; over the peak of every "
                  "device on accelerators (devices: the rows split over them), the host's "
                  "on CPUs (its devices share its cores)",
                  f"{MEMORY_NOTE} (per device)", SPREAD_NOTE]
