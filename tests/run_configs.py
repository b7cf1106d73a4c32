"""Small run configs for the training tests: configs/default.py shrunk to seconds, the
runs the tests share and how conftest.py trains them; the files of a checkpoint step that
the damage tests break; and the search settings every translator refuses, in translate.py's
words."""

import importlib.util
import pathlib

import jax
import pytest

from transformer_jax.run_config import model_fields

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_config(name: str):
    path = ROOT / "configs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def rows_per_device(rows: int) -> int:
    """The rows per device that make `rows` rows an update on this process's devices (8 rows:
    1 on the CPU's 8 simulated devices, 8 on one GPU), so that a run sees the same batches
    on either."""
    devices = jax.local_device_count()
    assert rows % devices == 0, f"{rows} rows do not split over {devices} devices"
    return rows // devices


def tiny_run(**overrides):
    """The default run with the tiny model, one layer a side, on the small numbers split: a step
    takes milliseconds."""
    config = load_config("default")
    config.model = model_fields("tiny")
    # One layer: the training loop's tests need no stack (the model's tests stack two), and
    # each layer less is a quarter less of the tiny train step to compile (about 7 s of 24 s
    # a run, 2-core CPU).
    config.model.num_layers = 1
    config.data.numbers_size = "small"
    config.data.max_source_length = 12
    config.data.max_target_length = 24
    config.per_device_batch_size = rows_per_device(8)
    config.num_train_steps = 4
    config.log_every_steps = 2
    config.eval_every_steps = 4
    config.checkpoint_every_steps = 4
    config.num_eval_batches = 2
    config.optim.warmup_steps = 10
    config.optim.learning_rate_scale = 1.0  # the tiny model's few steps take the full rate
    config.decode.bleu_every_steps = 0  # beam search compiles slowly; one test turns it on
    for key, value in overrides.items():
        target = config
        *groups, name = key.split(".")
        for group in groups:
            target = target[group]
        target[name] = value
    return config


def shared_run(**overrides):
    """The run conftest.py's `trained_run` trains once for the tests that read a trained
    workdir: 4 steps of the tiny run, logged and saved at steps 2 and 4, no evaluation, and
    gradient clipping (one optimizer stage more than the default). `overrides` as in
    `tiny_run`, e.g. more steps to resume a copy of it."""
    return tiny_run(**{"num_train_steps": 4, "checkpoint_every_steps": 2, "num_eval_batches": 0,
                       "optim.grad_clip_norm": 1.0, **overrides})


def translating_run():
    """A model that translates (test BLEU 64 measured), trained in about 37 s in a process of
    its own (conftest.py): the tiny run twice as wide for 400 steps of 32 rows. Its outputs
    end with EOS where the data's do, so searches compared on it are compared where they
    matter."""
    return tiny_run(**{"num_train_steps": 400, "checkpoint_every_steps": 400,
                       "log_every_steps": 100, "eval_every_steps": 400,
                       "per_device_batch_size": rows_per_device(32), "optim.warmup_steps": 100,
                       "model.d_model": 64, "model.d_ff": 128, "model.num_layers": 2})


def train_counting_fetches(config, workdir: pathlib.Path) -> dict:
    """Trains `config` in `workdir`: {"records": its training records, "fetched": the keys
    of each tree `Parallel.to_host` brought to the host meanwhile}."""
    from transformer_jax.parallel import Parallel
    from transformer_jax.trainer import train

    fetched, to_host = [], Parallel.to_host
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Parallel, "to_host", lambda self, tree: fetched.append(
            sorted(tree)) or to_host(self, tree))
        result = train(config, str(workdir))
    return {"records": result.records, "fetched": fetched}


def array_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    """The array data files of checkpoint folder `step_dir` (orbax's OCDBT layout)."""
    return list(step_dir.glob("state/ocdbt.process_0/d/*"))


def biggest_array_file(step_dir: pathlib.Path) -> pathlib.Path:
    """The largest array data file of checkpoint folder `step_dir`."""
    return max(array_files(step_dir), key=lambda p: p.stat().st_size)


# Each search setting translate.py's flag refuses, and the ValueError's message for it in
# every Translator (from absl's parsers, run_config.SEARCH_SETTINGS).
BAD_SEARCH_SETTINGS = (
    (dict(beam_size=0), "beam_size=0: 0 is not a positive integer"),
    (dict(batch_size=0), "batch_size=0: 0 is not a positive integer"),
    (dict(alpha=-1.0), "alpha=-1.0: -1.0 is not a non-negative number"),
    (dict(alpha=float("nan")), "alpha=nan: nan is not a non-negative number"),
    (dict(alpha=float("inf")), "alpha=inf: inf is not a non-negative number"),
    (dict(max_extra_length=-1), "max_extra_length=-1: -1 is not a non-negative integer"),
    (dict(max_input_length=0), "max_input_length=0: 0 is not a positive integer"))
