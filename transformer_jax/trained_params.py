"""The parameters a trained run translates with, chosen by `--checkpoint`.

    latest     the newest checkpoint that restores (a damaged newer one is skipped)
    N          the checkpoint of step N
    average:N  the element-wise mean of the last N checkpoints (§6.1: the base models
               average the last 5, the big ones the last 20)

Only the parameters are read (`Checkpointer.restore_params`), into the shapes of the
model the checkpoint's metadata describes: the optimizer is never rebuilt, so a run
whose optimizer or optim config this version cannot build still translates.
"""

import dataclasses
import json
import operator
import os
from typing import NamedTuple

import jax
import numpy as np

from transformer_jax.argument_checks import value_kind
from transformer_jax.checkpoint import Checkpointer, DamagedCheckpointError
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig
from transformer_jax.train_state import abstract_params


class CheckpointChoiceError(ValueError):
    """No checkpoint to use: none saved, none that reads, or a --checkpoint naming none."""


class TrainedParams(NamedTuple):
    """The chosen steps, the metadata of the last one, its model and the parameters."""

    steps: list[int]
    metadata: dict
    model: Transformer
    params: dict


def checkpoints_named(steps: list[int]) -> str:
    """"checkpoint 500", or "the average of checkpoints 300, 400, 500": the parameters in
    use, as the commands name them."""
    if len(steps) == 1:
        return f"checkpoint {steps[0]}"
    return f"the average of checkpoints {', '.join(map(str, steps))}"


def chosen_steps(steps: list[int], which: str) -> list[int]:
    """The steps among the saved `steps` (ascending) that `which` names."""
    if which == "latest":
        return steps[-1:]
    if which.startswith("average:"):
        count = which.removeprefix("average:")
        if not count.isdigit():
            raise CheckpointChoiceError(f"checkpoint {which!r}: average:N needs a number of "
                                        f"checkpoints N, e.g. average:5")
        n = int(count)
        if n < 1:
            raise CheckpointChoiceError(f"checkpoint {which!r}: average:N averages the last N "
                                        f"checkpoints, N 1 or more, e.g. average:5")
        if n > len(steps):
            there = (f"there is 1 (step {steps[0]})" if len(steps) == 1 else
                     f"there are {len(steps)} (steps {', '.join(map(str, steps))})")
            raise CheckpointChoiceError(f"average:{n} needs {n} checkpoints; {there}")
        return steps[-n:]
    if which.isdigit() and int(which) in steps:
        return [int(which)]
    listed = ", ".join(map(str, steps))
    raise CheckpointChoiceError(f"checkpoint {which!r}: use latest, a step ({listed}) "
                                f"or average:N")


def average_params(param_trees):
    """The element-wise mean of several parameter trees (§6.1: checkpoint averaging)."""
    return jax.tree.map(lambda *leaves: sum(leaves) / len(leaves), *param_trees)


def inference_model(saved: dict) -> Transformer:
    """The model of a checkpoint's metadata (`saved`, its "model"), to translate or evaluate
    here. Off a GPU the Pallas layer norm would run in Pallas's interpreter, so there a run
    trained with it uses Flax's, the same function of the same parameters."""
    config = ModelConfig(**saved)
    if config.layer_norm_implementation == "pallas" and jax.default_backend() != "gpu":
        config = dataclasses.replace(config, layer_norm_implementation="xla")
    return Transformer(config)


def _read(checkpointer: Checkpointer, step: int) -> TrainedParams:
    metadata = checkpointer.metadata(step)
    model = inference_model(metadata["model"])
    params = checkpointer.restore_params(step, abstract_params(model))
    return TrainedParams([step], metadata, model, params)


def load_trained_params(workdir: str, which: str | int = "latest") -> TrainedParams:
    """The parameters of `workdir`'s checkpoints that `which` names (see above; a step may
    be an int)."""
    if value_kind(which) in "iu" and np.ndim(which) == 0:  # NumPy's and JAX's too, no bool
        which = str(operator.index(which))
    elif not isinstance(which, str):
        raise TypeError(f"checkpoint must be latest, a step or average:N, got {which!r}")
    directory = _checkpoints_folder(workdir)
    with Checkpointer(directory, keep=1_000_000) as checkpointer:
        steps = checkpointer.all_steps()
        if not steps:
            raise CheckpointChoiceError(f"no checkpoint in {directory}; train first "
                                        f"(python train.py --workdir=...)")
        steps = chosen_steps(steps, which)
        if which == "latest":  # the newest that restores; training moves damaged ones
            found = checkpointer.newest(lambda s: _read(checkpointer, s), move_aside=False)
            if found is None:
                raise CheckpointChoiceError(f"no checkpoint in {directory} can be read")
            return found[1]
        for attempt in range(3):
            try:
                reads = [checkpointer.read(s, lambda s: _read(checkpointer, s)) for s in steps]
                break
            except DamagedCheckpointError as error:
                # A run training beside this read saved a step and removed its oldest
                # (checkpoints_to_keep): the steps are chosen again, not called damaged.
                if os.path.isdir(os.path.join(directory, str(error.step))) or attempt == 2:
                    raise CheckpointChoiceError(f"{error}; --checkpoint=latest falls back to "
                                                f"the newest that restores") from None
                steps = chosen_steps(checkpointer.all_steps(reload=True), which)
    return reads[-1]._replace(steps=steps, params=average_params([r.params for r in reads]))


def _checkpoints_folder(workdir: str) -> str:
    """WORKDIR/checkpoints, or a CheckpointChoiceError that says what `workdir` is instead
    (empty, an export, no folder, a run's checkpoints or one of them, a folder of runs) and
    what to pass: "train first" would mislead each of them."""
    if not workdir:  # os.path.abspath("") is the current directory
        raise CheckpointChoiceError("the workdir is empty (an unset shell variable?); name a "
                                    "training run's folder")
    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    if os.path.isfile(manifest := os.path.join(workdir, "export.json")):
        raise CheckpointChoiceError(f"{workdir} is an export, not a training run; translate "
                                    f"with translate.py --engine={_format_of(manifest)} "
                                    f"--exported={workdir}")
    if not os.path.isdir(workdir):  # a misspelt path
        raise CheckpointChoiceError(f"{workdir}: " + ("a file, not a training run's folder"
                                                      if os.path.exists(workdir) else
                                                      "no such folder (the training run's "
                                                      "workdir)"))
    run, name = os.path.split(os.path.normpath(workdir))
    if name == "checkpoints" and not os.path.isdir(directory) and any(  # step folders: 800, ...
            entry.isdigit() for entry in os.listdir(workdir)):
        raise CheckpointChoiceError(f"{workdir} is a run's checkpoints folder; name the run's "
                                    f"own folder: --workdir={run or os.curdir}")
    parent = os.path.basename(os.path.dirname(os.path.abspath(workdir)))
    if name.isdigit() and parent == "checkpoints" and not os.path.isdir(directory):
        run = os.path.dirname(os.path.dirname(os.path.normpath(workdir)))
        raise CheckpointChoiceError(f"{workdir} is a checkpoint of a run; name the run's own "
                                    f"folder, and the step with --checkpoint: "
                                    f"--workdir={run or os.curdir} --checkpoint={name}")
    if not os.path.isdir(directory):
        runs = sorted(entry for entry in os.listdir(workdir)  # a folder of runs: runs/
                      if os.path.isdir(os.path.join(workdir, entry, "checkpoints")))
        if runs:
            shown = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if runs[5:] else "")
            raise CheckpointChoiceError(f"{workdir} holds training runs ({shown}), not one of "
                                        f"its own; name one: --workdir="
                                        f"{os.path.join(workdir, runs[0])}")
        raise CheckpointChoiceError(f"{workdir} has no checkpoints; train first "
                                    f"(python train.py --workdir={workdir})")
    return directory


def _format_of(manifest: str) -> str:
    """The format an export.json names, or "FORMAT" where it names none that can be read."""
    try:
        with open(manifest, encoding="utf-8") as f:
            fmt = json.load(f).get("format")
    except (OSError, ValueError, AttributeError):
        fmt = None
    return fmt if isinstance(fmt, str) and fmt.isidentifier() else "FORMAT"
