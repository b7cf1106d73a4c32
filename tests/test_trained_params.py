"""--checkpoint's choice of steps and checkpoint averaging (the workdir cases run in
tests/test_translation.py, through translate.py and evaluate.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model_config import get_model_config
from transformer_jax.trained_params import (CheckpointChoiceError, average_params, chosen_steps,
                                            inference_model, load_trained_params)

STEPS = [2, 4, 6]


def test_latest_a_step_and_the_last_n():
    assert chosen_steps(STEPS, "latest") == [6]
    assert chosen_steps(STEPS, "4") == [4]
    assert chosen_steps(STEPS, "average:1") == [6]
    assert chosen_steps(STEPS, "average:3") == [2, 4, 6]


@pytest.mark.parametrize("which, message", [
    ("3", r"checkpoint '3': use latest, a step \(2, 4, 6\) or average:N"),
    ("average:4", r"^average:4 needs 4 checkpoints; there are 3 \(steps 2, 4, 6\)$"),
    ("average:0", r"^checkpoint 'average:0': average:N averages the last N checkpoints, N 1 or "
                  r"more, e.g. average:5$"),
    ("average:x", "average:N needs a number of checkpoints N"),
    ("newest", "use latest, a step"),
])
def test_a_choice_naming_no_saved_step_is_refused(which, message):
    with pytest.raises(CheckpointChoiceError, match=message):
        chosen_steps(STEPS, which)


def test_too_few_checkpoints_to_average_names_the_one_there_is():
    with pytest.raises(CheckpointChoiceError, match=r"^average:2 needs 2 checkpoints; there "
                                                    r"is 1 \(step 6\)$"):
        chosen_steps([6], "average:2")


def test_average_params_is_the_element_wise_mean():
    trees = [{"w": np.array([1.0, 3.0]), "b": np.array(0.0)},
             {"w": np.array([3.0, 5.0]), "b": np.array(3.0)}]
    averaged = average_params(trees)
    assert averaged["w"].tolist() == [2.0, 4.0] and averaged["b"] == 1.5


def test_average_params_weighs_every_checkpoint_alike():
    """average:N of N > 2 (§6.1: 5 for base, 20 for big) is the mean of all N, each counted
    once: not the first and last alone, nor the newest counted more."""
    trees = [{"w": np.array([1.0, 3.0])}, {"w": np.array([3.0, 5.0])},
             {"w": np.array([8.0, 1.0])}]
    assert average_params(trees)["w"].tolist() == [4.0, 3.0]
    five = [{"w": np.array([float(step)])} for step in (100, 200, 300, 400, 1000)]
    assert average_params(five)["w"].tolist() == [400.0]


def test_an_empty_workdir_is_refused_not_taken_for_the_current_folder(tmp_path, monkeypatch):
    """`--workdir=$RUN` with RUN unset: evaluate.py and the export say so, even where the
    current folder holds checkpoints."""
    (tmp_path / "checkpoints").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointChoiceError, match=r"^the workdir is empty \(an unset shell "):
        load_trained_params("")


def test_a_missing_workdir_is_named_and_an_empty_one_is_sent_to_train(tmp_path):
    """A misspelt --workdir is "no such folder", not "train first"; a folder without
    checkpoints is."""
    missing = str(tmp_path / "runs" / "defualt")
    with pytest.raises(CheckpointChoiceError) as error:
        load_trained_params(missing)
    assert str(error.value) == f"{missing}: no such folder (the training run's workdir)"
    with pytest.raises(CheckpointChoiceError, match=r"has no checkpoints; train first"):
        load_trained_params(str(tmp_path))


def test_a_folder_of_runs_is_sent_to_one_of_them(tmp_path):
    """--workdir=runs (the folder holding the runs) said "train first (python train.py
    --workdir=runs)": a run beside the others. The runs in it are named instead."""
    for run in ("default", "big"):
        (tmp_path / "runs" / run / "checkpoints" / "800").mkdir(parents=True)
    (tmp_path / "runs" / "notes").mkdir()  # not a run
    with pytest.raises(CheckpointChoiceError) as error:
        load_trained_params(str(tmp_path / "runs"))
    assert str(error.value) == (f"{tmp_path}/runs holds training runs (big, default), not one "
                                f"of its own; name one: --workdir={tmp_path}/runs/big")


def test_a_runs_checkpoints_folder_is_sent_to_the_run(tmp_path, monkeypatch):
    """--workdir=runs/x/checkpoints said "train first (python train.py
    --workdir=runs/x/checkpoints)": a run inside the run's own checkpoints. A run named
    checkpoints, with no step folders, is still sent to train."""
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointChoiceError, match=r"has no checkpoints; train first"):
        load_trained_params(str(tmp_path / "checkpoints"))
    (tmp_path / "run" / "checkpoints" / "800").mkdir(parents=True)
    for given, run in [(f"{tmp_path}/run/checkpoints/", f"{tmp_path}/run"),
                       ("checkpoints", ".")]:
        monkeypatch.chdir(tmp_path / "run")
        with pytest.raises(CheckpointChoiceError) as error:
            load_trained_params(given)
        assert str(error.value) == (f"{given} is a run's checkpoints folder; name the run's "
                                    f"own folder: --workdir={run}")
    # A step's folder (what one pastes to serve a checkpoint) names the step too.
    for given, run in [(f"{tmp_path}/run/checkpoints/800", f"{tmp_path}/run"),
                       ("checkpoints/800/", ".")]:
        with pytest.raises(CheckpointChoiceError) as error:
            load_trained_params(given)
        assert str(error.value) == (f"{given} is a checkpoint of a run; name the run's own "
                                    f"folder, and the step with --checkpoint: --workdir={run} "
                                    f"--checkpoint=800")


def test_a_run_trained_with_the_pallas_norm_translates_with_flaxs_off_a_gpu():
    """The checkpoint's model as saved, but the layer norm: Pallas's kernels on a GPU, Flax's
    elsewhere (where the kernels would be interpreted); every other field as saved."""
    saved = dataclasses.asdict(get_model_config("tiny", layer_norm_implementation="pallas",
                                                dropout_bits=8))
    config = inference_model(saved).config
    on_gpu = jax.default_backend() == "gpu"
    assert config.layer_norm_implementation == ("pallas" if on_gpu else "xla")
    assert dataclasses.replace(config, layer_norm_implementation="pallas") == \
        get_model_config("tiny", layer_norm_implementation="pallas", dropout_bits=8)
    assert inference_model({**saved, "layer_norm_implementation": "xla"}).config == \
        get_model_config("tiny", dropout_bits=8)


def test_a_step_may_be_an_int(trained_run):
    """`Translator.from_workdir(workdir, checkpoint=2)`, as Python callers write it, is the
    step that "2" names (the shared run saved steps 2 and 4); a float is refused."""
    workdir = str(trained_run.workdir)
    by_str, by_int = (load_trained_params(workdir, which) for which in ("2", 2))
    assert by_int.steps == by_str.steps == [2]
    jax.tree.map(np.testing.assert_array_equal, by_int.params, by_str.params)
    for which in (np.int64(2), jnp.int32(2)):  # a step read from an array, as sizes may be
        assert load_trained_params(workdir, which).steps == [2]
    with pytest.raises(TypeError, match=r"got True$"):  # no step, though Python's int
        load_trained_params(workdir, True)
    with pytest.raises(TypeError, match=r"^checkpoint must be latest, a step or average:N, "
                                        r"got 2\.0$"):
        load_trained_params(workdir, 2.0)


def test_an_average_read_while_training_saves_and_removes_steps_chooses_them_again(
        trained_run, tmp_path, monkeypatch):
    """translate.py --checkpoint=average:2 beside a run that saves: its newest step is
    saved and its oldest removed (checkpoints_to_keep) between the listing and the read.
    The steps are chosen again; before, the removed step was called damaged and the
    command stopped. A step that is there and fails to read is still named as damaged."""
    import shutil

    from transformer_jax import trained_params

    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    checkpoints = workdir / "checkpoints"
    read, calls = trained_params._read, []

    def saved_meanwhile(checkpointer, step):
        if not calls:  # as the run's save of step 6 and its removal of step 2
            shutil.copytree(checkpoints / "4", checkpoints / "6")
            shutil.rmtree(checkpoints / "2")
        calls.append(step)
        return read(checkpointer, step)

    monkeypatch.setattr(trained_params, "_read", saved_meanwhile)
    averaged = load_trained_params(str(workdir), "average:2")
    assert averaged.steps == [4, 6] and calls == [2, 4, 6]
    step_4 = load_trained_params(str(workdir), "4")
    jax.tree.map(np.testing.assert_array_equal, averaged.params, step_4.params)  # 6 is 4
    for data_file in (checkpoints / "6").glob("state/ocdbt.process_0/d/*"):
        data_file.unlink()
    with pytest.raises(CheckpointChoiceError, match=r"^checkpoint 6 cannot be read: .*"
                                                    r"; --checkpoint=latest falls back"):
        load_trained_params(str(workdir), "average:2")


def test_an_average_has_the_newest_steps_metadata_and_model(trained_run, tmp_path):
    """A run resumed with another dropout (resume allows it) saved step 4 with another
    model config than step 2: average:2 is the mean of both steps' parameters, with the
    metadata and the model of the newest."""
    import json
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    metadata_file = workdir / "checkpoints" / "4" / "metadata" / "metadata"
    metadata = json.loads(metadata_file.read_text())
    metadata["model"]["dropout_rate"] = 0.25
    metadata_file.write_text(json.dumps(metadata))
    step_2, step_4 = (load_trained_params(str(workdir), step) for step in ("2", "4"))
    assert step_2.model.config != step_4.model.config
    averaged = load_trained_params(str(workdir), "average:2")
    assert averaged.metadata == step_4.metadata == metadata
    assert averaged.model.config == step_4.model.config
    jax.tree.map(lambda a, x, y: np.testing.assert_allclose(a, (x + y) / 2, rtol=1e-6),
                 averaged.params, step_2.params, step_4.params)
