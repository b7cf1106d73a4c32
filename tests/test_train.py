"""The training loop: steps on real and mock data, learning, exact resume, stops and errors."""

import dataclasses
import errno
import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from run_configs import ROOT, load_config, rows_per_device, shared_run, tiny_run
from transformer_jax import run_log
from transformer_jax.checkpoint import Checkpointer
from transformer_jax.output_paths import OutputPathError, writable_folder
from transformer_jax.parallel import Parallel
from transformer_jax.run_log import MetricsWriteError
from transformer_jax.stop_signal import StoppedAtOnce
from transformer_jax.trained_params import load_trained_params
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config
from transformer_jax.resume_checks import (changed_layout, changed_settings, refuse_other_model,
                                          refuse_other_optimizer, refuse_other_run,
                                          refuse_other_vocabulary)
from transformer_jax.metrics_window import MetricsWindow, NonFiniteLossError
from transformer_jax.config_checks import check_config
from transformer_jax.data import DataError
from transformer_jax.run_messages import finished_line
from transformer_jax.trainer import ConfigError, _perplexity, train


def records(workdir) -> list[dict]:
    with open(pathlib.Path(workdir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_one_step_on_the_builtin_data(tmp_path, capsys):
    """One train step and one evaluation: metrics.jsonl, TensorBoard files, a checkpoint,
    and a last line saying where they are; a profile asked of a run too short for it is
    named, not silently skipped."""
    result = train(tiny_run(num_train_steps=1, profile_steps=5), str(tmp_path))
    assert result.step == 1 and not result.stopped_early
    out = capsys.readouterr().out
    assert ("note: nothing is traced: config.profile_steps traces steps after the first 10 "
            "of a start (from step 11), and this run ends at step 1") in out
    # Where the results are, and what uses them, last.
    assert out.splitlines()[-1] == finished_line(str(tmp_path), 1, f"{tmp_path}/checkpoints")
    assert not (tmp_path / "plugins").exists()
    train_record, eval_record = records(tmp_path)
    assert train_record["step"] == 1 and train_record["loss"] > 0
    # Its only step waited for compiling: no rates rather than the compiler's (MetricsWindow).
    assert "tokens_per_sec" not in train_record and "steps_per_sec" not in train_record
    # The schedule of §5.3 at step 1 (tiny: d_model 32; warmup 10).
    assert train_record["learning_rate"] == pytest.approx(32**-0.5 * 10**-1.5, rel=1e-6)
    assert set(eval_record) == {"step", "eval_loss", "eval_accuracy", "eval_perplexity",
                                "elapsed_s"}
    assert eval_record["elapsed_s"] >= train_record["elapsed_s"] > 0
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path))
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Checkpointer(str(tmp_path / "checkpoints"), keep=1).all_steps() == [1]


# WMT-like records, as a TFDS translation data source holds them.
MOCK_WMT = [{"de": f"Das ist Satz {i}.".encode(), "en": f"This is sentence {i}.".encode()}
            for i in range(40)]


def test_one_step_on_mock_tfds_data(tmp_path):
    config = tiny_run(num_train_steps=1, **{"data.dataset": "tfds:wmt14_translate/de-en",
                                            "data.source_lang": "en", "data.target_lang": "de",
                                            "data.vocab_size": 300})
    with tfds.testing.mock_data(as_data_source_fn=lambda builder, split, **_: MOCK_WMT):
        result = train(config, str(tmp_path))
    assert result.step == 1 and records(tmp_path)[-1]["eval_loss"] > 0


def test_each_steps_metrics_reach_the_host_once(trained_run):
    """Steps 2 and 4 both log and save: each step's metrics are fetched once, not once per
    periodic action (no evaluation here, which fetches its own sums). The shared run
    (conftest.py) notes each `Parallel.to_host` while it trains."""
    config = trained_run.config
    assert (config.num_train_steps, config.log_every_steps, config.checkpoint_every_steps,
            config.num_eval_batches) == (4, 2, 2, 0)
    assert [r["step"] for r in trained_run.records] == [2, 4]
    fetched = trained_run.fetched
    assert len(fetched) == 4 and all("loss_sum" in keys for keys in fetched)
    with Checkpointer(str(trained_run.workdir / "checkpoints"), keep=2) as checkpointer:
        assert checkpointer.all_steps() == [2, 4]


def test_the_last_line_gives_the_commands_with_this_interpreter_where_it_is_the_projects(
        monkeypatch):
    """make train's .venv/bin/python (under the working directory) as it is; another
    interpreter as "python"."""
    monkeypatch.setattr(sys, "executable", os.path.join(os.getcwd(), ".venv", "bin", "python"))
    assert finished_line("/w", 800, "/w/checkpoints") == (
        "trained to step 800: saved to /w/checkpoints/800, curves in /w/curves.png; translate "
        "with .venv/bin/python translate.py --workdir=/w, score the test split with "
        ".venv/bin/python evaluate.py --workdir=/w")
    monkeypatch.setattr(sys, "executable", os.path.join(os.path.dirname(os.getcwd()), "py"))
    assert "translate with python translate.py --workdir=/w, score the test split with " \
           "python evaluate.py" in finished_line("/w", 800, "/w/checkpoints")


def test_the_last_line_names_the_scripts_beside_the_train_py_that_ran(monkeypatch, tmp_path):
    """`python path/to/train.py` from another folder: the scripts by the path to them (they
    were named bare, and no translate.py was there); from the project's root, or a folder
    above it, by the relative path; bare where no train.py runs (a notebook)."""
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    monkeypatch.setattr(sys, "argv", [str(project / "train.py"), "--workdir=/w"])
    for folder, script in ((project / "sub", str(project / "translate.py")),
                           (project, "translate.py"),
                           (tmp_path, os.path.join("project", "translate.py"))):
        monkeypatch.chdir(folder)
        assert (f"translate with python {script} --workdir=/w, score the test split with "
                f"python {script.replace('translate', 'evaluate')} --workdir=/w") in \
            finished_line("/w", 800, "/w/checkpoints")
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py"])
    assert "translate with python translate.py --workdir=/w" in finished_line(
        "/w", 800, "/w/checkpoints")


def test_perplexity_is_the_exp_of_the_loss_and_inf_past_a_floats_range(tmp_path):
    """A diverged run's evaluation (loss 12,750) logs perplexity inf, not exp(50), and the
    record reaches metrics.jsonl, TensorBoard and curves.png."""
    assert _perplexity(math.log(30.0)) == pytest.approx(30.0, rel=1e-12)
    assert _perplexity(700.0) == math.exp(700.0)
    assert _perplexity(1.275e4) == math.inf
    log = run_log.RunLog(str(tmp_path), total_steps=2, first_step=0)
    log.write(2, {"eval_loss": 1.275e4, "eval_perplexity": _perplexity(1.275e4)})
    log.close()
    assert records(tmp_path)[-1]["eval_perplexity"] == math.inf
    assert (tmp_path / "curves.png").exists()


def test_loss_falls_over_30_steps(tmp_path):
    result = train(tiny_run(num_train_steps=30, log_every_steps=5, **{"optim.warmup_steps": 30}),
                   str(tmp_path))
    losses = [r["loss"] for r in result.records]
    assert len(losses) == 6
    assert losses[-1] < 0.8 * losses[0]


def test_the_host_queues_at_most_two_steps_ahead_of_the_devices(tmp_path, monkeypatch):
    """Each step's metrics pass through a host callback that sleeps 10 ms a device: the devices lag
    and the host, free to dispatch, would queue every step. When it dispatches a step, at
    most STEPS_AHEAD (2) earlier ones are unfinished, so a stop signal waits for 2 steps,
    not for the whole queue (about 30 on a 2-core CPU before the bound)."""
    from transformer_jax import trainer as trainer_module

    assert trainer_module.STEPS_AHEAD == 2

    def sleep_then(value):
        time.sleep(0.01)
        return value

    # pmapped as the step (tiny_run's strategy): its output is the step's, device by device.
    slowly = jax.pmap(lambda x: jax.pure_callback(
        sleep_then, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
    compile_train_step, returned, unfinished = Parallel.compile_train_step, [], []

    def compile_slow_step(self, step_fn, compiler_options=None):
        step = compile_train_step(self, step_fn, compiler_options)

        def slow_step(state, batch):
            unfinished.append(sum(not m["loss_sum"].is_ready() for m in returned))
            state, metrics = step(state, batch)
            returned.append({**metrics, "loss_sum": slowly(metrics["loss_sum"])})
            return state, returned[-1]
        return slow_step

    monkeypatch.setattr(Parallel, "compile_train_step", compile_slow_step)
    train(tiny_run(num_train_steps=10, log_every_steps=10, num_eval_batches=0,
                   checkpoint_every_steps=10), str(tmp_path))
    assert len(unfinished) == 10 and max(unfinished) <= 2, unfinished
    assert max(unfinished) == 2, unfinished  # the callback did make the devices lag


# bfloat16 is the GPU's dtype (and 70 s more on a 2-core CPU).
RESUME_DTYPES = ["float32"] + (["bfloat16"] if jax.default_backend() == "gpu" else [])


def straight_and_resumed(workdir, dtype: str) -> dict:
    """Losses of 8 steps in one run, of 4 steps + a restart + 4 more, and the resumed run's
    metrics.jsonl, as {"straight": [(step, loss)], "resumed": [...], "logged": [...]}."""
    workdir = pathlib.Path(workdir)
    run = lambda steps: tiny_run(num_train_steps=steps, **{"model.dtype": dtype})  # noqa: E731
    straight = train(run(8), str(workdir / "straight"))
    first = train(run(4), str(workdir / "resumed"))
    # As if killed after logging step 6 but before its checkpoint: resuming logs it again.
    with open(workdir / "resumed" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 6, "loss": 123.0}) + "\n")
    second = train(run(8), str(workdir / "resumed"))
    pairs = lambda rs: [[r["step"], r["loss"]] for r in rs if "loss" in r]  # noqa: E731
    return {"straight": pairs(straight.records), "resumed": pairs(first.records + second.records),
            "logged": pairs(records(workdir / "resumed"))}


def straight_and_resumed_with_deterministic_ops(workdir, dtype: str) -> dict:
    """The same in a fresh process with XLA's deterministic GPU kernels: on an H100 (jax
    0.11.2) float32 steps were not bit-reproducible from one compilation to the next without
    them (XLA's own float32 kernels; bfloat16, with cuDNN attention, was)."""
    code = ("import json, sys; sys.path.insert(0, 'tests'); import test_train; "
            f"print(json.dumps(test_train.straight_and_resumed({str(workdir)!r}, {dtype!r})))")
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                                      + " --xla_gpu_deterministic_ops=true").strip())
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", RESUME_DTYPES)
def test_resume_is_exact(tmp_path, dtype):
    """8 steps in one run = 4 steps, a restart, 4 more: the same loss at every logged step."""
    on_gpu_in_float32 = jax.default_backend() == "gpu" and dtype == "float32"
    losses = (straight_and_resumed_with_deterministic_ops if on_gpu_in_float32
              else straight_and_resumed)(tmp_path, dtype)
    assert [step for step, _ in losses["straight"]] == [2, 4, 6, 8]
    assert losses["resumed"] == losses["straight"]
    assert losses["logged"] == losses["straight"]


def test_refuses_a_workdir_of_another_model(trained_run, tmp_path):
    """A copy of the shared run (conftest.py), whose tiny model has d_model 32."""
    shutil.copytree(trained_run.workdir, tmp_path / "run")
    with pytest.raises(ConfigError, match="another model.*d_model: saved 32, now 64"):
        train(tiny_run(num_train_steps=2, **{"model.d_model": 64}), str(tmp_path / "run"))


def test_a_model_field_newer_than_the_checkpoint_counts_as_its_default():
    """A checkpoint written before a field existed resumes with its default and names it
    when another value is asked for; a saved value is compared as it is. Fields of how the
    steps compute (dropout_bits) are returned, named, instead of refused."""
    model = get_model_config("tiny")
    older = {k: v for k, v in dataclasses.asdict(model).items()
             if k not in ("pre_layer_norm", "dropout_bits")}
    assert refuse_other_model(older, model, "W") == []
    with pytest.raises(ConfigError,
                       match=r"pre_layer_norm: not saved \(so False, its default\), now True"):
        refuse_other_model(older, dataclasses.replace(model, pre_layer_norm=True), "W")
    with pytest.raises(ConfigError, match="pre_layer_norm: saved True, now False"):
        refuse_other_model({**older, "pre_layer_norm": True}, model, "W")
    assert refuse_other_model(older, dataclasses.replace(model, dropout_bits=8), "W") == [
        "model.dropout_bits: not saved (so 16, its default), now 8"]


def test_a_learned_position_table_of_another_length_is_another_model():
    """max_length is the learned table's rows: a checkpoint of 128 rows does not resume
    with 64, as a field of how the steps compute (COMPUTE_FIELDS) would."""
    model = get_model_config("tiny", positional_encoding="learned")
    saved = dataclasses.asdict(model)
    with pytest.raises(ConfigError, match=r"another model \(max_length: saved 128, now 64\)"):
        refuse_other_model(saved, dataclasses.replace(model, max_length=64), "W")


def test_a_checkpoint_of_another_tokenizer_is_refused():
    """The same model and optimizer, but a checkpoint whose tokenizer's SHA-256 is not the
    workdir's tokenizer's: refused in one ConfigError naming both; the same SHA-256 resumes."""
    config = shared_run()
    model = get_model_config("tiny", **config.model.to_dict(),
                             vocab_size=config.data.vocab_size)
    metadata = {"model": dataclasses.asdict(model), "config": config.to_dict(),
                "tokenizer_sha256": "a" * 64}
    tokenizer = types.SimpleNamespace(sha256="b" * 64)
    with pytest.raises(ConfigError) as caught:
        refuse_other_run(metadata, model, config.optim, tokenizer, workdir="W",
                         where="W/checkpoints/4")
    assert str(caught.value).startswith(
        "W/checkpoints/4 was trained with another tokenizer (SHA-256 aaaaaaaaaaaa...) than the "
        "workdir's tokenizer.model (bbbbbbbbbbbb...)")
    refuse_other_run(metadata, model, config.optim, types.SimpleNamespace(sha256="a" * 64),
                     workdir="W", where="W/checkpoints/4")


def test_a_resume_names_each_learning_setting_changed_and_only_those():
    """changed_settings names each of the keys asked about that the checkpoint saved with
    another value: the seed and the micro-batches; not a key it did not save, nor one
    unchanged, nor one not asked about."""
    saved = {"seed": 0, "accumulation_steps": 1, "per_device_batch_size": 8}
    now = {"seed": 3, "accumulation_steps": 2, "per_device_batch_size": 4, "new_key": 1}
    assert changed_settings("config", saved, now, ("seed", "accumulation_steps", "new_key")) \
        == ["config.seed=0, now 3", "config.accumulation_steps=1, now 2"]


def test_who_draws_dropout_changes_with_pmaps_devices_not_with_a_meshs():
    """pmap folds each device's index into its key: another device count draws other masks
    (named); `sharded` draws the global batch's on any count (not named). Without dropout
    nothing is drawn, and only the rows per update can be named."""
    def layout(parallelism, devices, rows=8):
        return {"rows_per_update": rows, "devices": devices, "parallelism": parallelism}

    assert changed_layout(layout("sharded", 8), layout("sharded", 2), dropout=True) == []
    assert changed_layout(layout("pmap", 8), layout("pmap", 2), dropout=True) == [
        "dropout drawn by pmap on 8 devices, now pmap on 2"]
    assert changed_layout(layout("pmap", 8), layout("sharded", 2, rows=16), dropout=False) == [
        "layout.rows_per_update=8, now 16"]
    assert changed_layout({}, layout("pmap", 2), dropout=True) == []


def test_a_moved_corpus_folder_is_the_same_vocabulary():
    """The dataset's name is left to the tokenizer's SHA-256 (a folder moved or copied is
    the same data under another path); the other vocabulary settings are refused."""
    config = shared_run(**{"data.dataset": "folder:/data/new", "data.vocab_size": 300})
    metadata = {"config": {"data": {**config.data.to_dict(), "dataset": "folder:/data/old"}}}
    refuse_other_vocabulary(metadata, config.data, "W/checkpoints/4")
    config.data.vocab_size = 400
    with pytest.raises(ConfigError, match=r"^W/checkpoints/4 was trained with "
                                          r"data\.vocab_size=300, now 400, which changes "):
        refuse_other_vocabulary(metadata, config.data, "W/checkpoints/4")


def test_how_the_steps_compute_may_change_on_resume(trained_run, tmp_path, capsys):
    """dtype, dropout and the attention and layer norm implementations leave the parameters
    as they are: the run resumes with one line naming them, and one naming the optim
    settings and row lengths changed (a row length was not named); with them a changed d_ff
    is still refused."""
    shutil.copytree(trained_run.workdir, tmp_path / "run")
    saved = trained_run.config.model
    changes = {"model.dtype": "bfloat16", "model.dropout_rate": saved.dropout_rate / 2,
               "model.attention_implementation": "reference",
               "model.layer_norm_implementation": "pallas"}
    longer = trained_run.config.data.max_target_length + 8  # what the rows hold
    learning = {"optim.warmup_steps": 20, "optim.learning_rate_scale": 0.5,
                "data.max_target_length": longer}
    config = shared_run(num_train_steps=trained_run.config.num_train_steps, **changes,
                        **learning)
    assert train(config, str(tmp_path / "run")).step == trained_run.config.num_train_steps
    line = capsys.readouterr().err
    saved_optim = trained_run.config.optim  # named too: they change what the steps learn
    assert (f"with optim.learning_rate_scale={saved_optim.learning_rate_scale!r}, now 0.5; "
            f"optim.warmup_steps={saved_optim.warmup_steps!r}, now 20; data.max_target_length="
            f"{longer - 8}, now {longer} (the steps from here learn with the new values)") in line
    assert (f"model.attention_implementation: saved {saved.attention_implementation!r}, now "
            f"'reference'; model.dropout_rate: saved {saved.dropout_rate!r}, now "
            f"{saved.dropout_rate / 2!r}; model.dtype: saved 'float32', now 'bfloat16'; "
            f"model.layer_norm_implementation: saved 'xla', now 'pallas' "
            f"(they change how the steps compute, not the parameters)") in line
    with pytest.raises(ConfigError, match=r"another model \(d_ff: saved"):
        train(shared_run(num_train_steps=2, **changes, **{"model.d_ff": 48}), str(tmp_path / "run"))


def test_a_resume_names_the_rows_per_update_and_who_draws_dropout(trained_run, tmp_path,
                                                                  capsys):
    """Twice the rows per device under `sharded`: one line names the rows per update (not
    per_device_batch_size, which may change them or not: the same rows on twice the
    devices would) and who draws the dropout masks (pmap draws each device's)."""
    shutil.copytree(trained_run.workdir, tmp_path / "run")
    saved = trained_run.config
    assert (saved.parallelism, saved.model.dropout_rate > 0) == ("pmap", True)
    devices = jax.device_count()
    config = shared_run(num_train_steps=saved.num_train_steps + 1, parallelism="sharded",
                        per_device_batch_size=2 * saved.per_device_batch_size)
    assert train(config, str(tmp_path / "run")).step == saved.num_train_steps + 1
    line = capsys.readouterr().err
    rows = saved.per_device_batch_size * devices
    assert (f"4 with layout.rows_per_update={rows}, now {2 * rows}; dropout drawn by pmap on "
            f"{devices} devices, now sharded on {devices} (the steps from here learn with the "
            f"new values)") in line
    assert "per_device_batch_size" not in line


def files(workdir) -> dict[str, bytes]:
    """Every file under `workdir` by its path, but train.lock (each start writes its pid)."""
    return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob("*"))
            if p.is_file() and p.name != "train.lock"}


def test_a_resume_with_another_optimizer_stops_in_one_line_and_changes_nothing(
        trained_run, tmp_path):
    """The shared run clips gradients (optax.chain: one stage more than Adam); resumed
    without clipping: one ConfigError naming the setting, saved and new, before anything
    compiles. Every file of the workdir stays as it was: no checkpoint moved aside,
    metrics.jsonl untouched."""
    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    before = files(workdir)
    with pytest.raises(ConfigError) as caught:
        train(shared_run(num_train_steps=6, **{"optim.grad_clip_norm": 0.0}), str(workdir))
    assert str(caught.value) == (
        f"{workdir}/checkpoints/4 was written with optim.grad_clip_norm=1.0, now 0.0, which "
        f"changes the optimizer state; resume with the saved value, or train in a new --workdir")
    assert files(workdir) == before


def test_a_resume_with_another_vocabulary_is_refused_before_a_tokenizer_is_trained(
        trained_run, tmp_path):
    """The tokenizer and the prepared data deleted, and the run resumed with another
    tokenizer_type: the checkpoint's settings refuse it in one ConfigError before a unigram
    tokenizer is trained and the data prepared with it, only for its SHA-256 to be refused
    after; nothing is written."""
    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    for name in ("tokenizer.model", "tokenizer.model.json"):
        (workdir / name).unlink()
    shutil.rmtree(workdir / "prepared")
    before = files(workdir)
    assert trained_run.config.data.tokenizer_type == "bpe"
    with pytest.raises(ConfigError) as caught:
        train(shared_run(num_train_steps=6, **{"data.tokenizer_type": "unigram"}), str(workdir))
    assert str(caught.value) == (
        f"{workdir}/checkpoints/4 was trained with data.tokenizer_type='bpe', now 'unigram', "
        f"which changes the vocabulary; resume with the saved value, or train in a new "
        f"--workdir")
    assert files(workdir) == before


def test_only_optimizer_settings_that_change_its_state_are_refused():
    """Saved with clipping at 1.0: clipping at 0.5 and another learning_rate_scale keep the
    optimizer state's tree (they resume); no clipping drops a stage, and only that setting
    is named. Saved settings that build no optimizer are left to the restore's check."""
    saved = shared_run().optim.to_dict()
    assert saved["grad_clip_norm"] == 1.0
    same_tree = shared_run(**{"optim.grad_clip_norm": 0.5, "optim.learning_rate_scale": 0.5})
    refuse_other_optimizer(saved, same_tree.optim, 32, "W/checkpoints/4")
    other_tree = shared_run(**{"optim.grad_clip_norm": 0.0, "optim.learning_rate_scale": 0.5})
    with pytest.raises(ConfigError) as caught:
        refuse_other_optimizer(saved, other_tree.optim, 32, "W/checkpoints/4")
    assert str(caught.value) == (
        "W/checkpoints/4 was written with optim.grad_clip_norm=1.0, now 0.0, which changes "
        "the optimizer state; resume with the saved value, or train in a new --workdir")
    refuse_other_optimizer({"name": "another version's"}, other_tree.optim, 32, "W/4")


def test_a_state_that_does_not_fit_is_refused_when_the_saved_config_cannot_say_why(
        trained_run, tmp_path):
    """Saved optim settings that build no optimizer (another version's): the comparison of
    settings cannot tell, the restore's check of the saved state's tree does, before any
    array is read: one ConfigError, every file as it was."""
    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    for metadata_file in (workdir / "checkpoints").glob("*/metadata/metadata"):
        metadata = json.loads(metadata_file.read_text())
        metadata["config"]["optim"] = {"name": "an optimizer this version does not know"}
        metadata_file.write_text(json.dumps(metadata))
    before = files(workdir)
    with pytest.raises(ConfigError, match=(
            rf"^{workdir}/checkpoints/4: its state does not fit: \d+ saved arrays not in the "
            r"state restored into \(opt_state/1/0/count, \.\.\.\); \d+ of its arrays not saved "
            r"\(opt_state/0/count, \.\.\.\); resume with the config it was written with, or "
            r"train in a new --workdir$")):
        train(shared_run(num_train_steps=6, **{"optim.grad_clip_norm": 0.0}), str(workdir))
    assert files(workdir) == before


@pytest.mark.parametrize("key, value, saved", [("data.num_workers", 1, "0"),
                                               ("data.batching", "bucketed", "'packed'")])
def test_a_resume_with_another_kind_of_data_iterator_keeps_the_state_on_a_new_shuffle(
        trained_run, tmp_path, capsys, key, value, saved):
    """The shared run's data position (packed batches, made in this process) cannot be
    taken by the iterator of another kind: the run resumes at step 4 (not 0) on a new
    shuffle, with one warning; nothing is moved aside, the records up to step 4 stay."""
    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    logged = (workdir / "metrics.jsonl").read_text()
    result = train(shared_run(num_train_steps=6, **{key: value}), str(workdir))
    assert [r["step"] for r in result.records] == [6]
    assert (workdir / "metrics.jsonl").read_text().startswith(logged)
    assert [r["step"] for r in records(workdir)] == [2, 4, 6]
    assert not (workdir / "checkpoints-damaged").exists()
    with Checkpointer(str(workdir / "checkpoints"), keep=3) as checkpointer:
        assert checkpointer.all_steps() == [2, 4, 6]
    printed = capsys.readouterr()
    # Bucketed batches name their buckets once, not again for the new shuffle.
    assert printed.out.count("bucketed batches:") == (value == "bucketed")
    # The first line says where the run starts, what it trains and on what.
    tiny = shared_run().model
    count = sum(x.size for x in jax.tree.leaves(load_trained_params(str(workdir)).params))
    (start,) = [line for line in printed.out.splitlines() if "training steps" in line]
    devices = jax.devices()  # the CPU's 8 simulated devices, or one GPU
    on = f"{len(devices)} {devices[0].device_kind} device{'s' * (len(devices) > 1)}"
    layers = f"{tiny.num_layers} layer{'s' * (tiny.num_layers > 1)}"
    assert start.startswith(f"resumed at step 4; training steps 5-6: {count:,}"
                            f" parameters ({layers} of width {tiny.d_model}, "
                            f"float32) on {on}, pmap; ")
    assert ("8 packed rows of 12 + 24 tokens per update;" if value != "bucketed"
            else "bucketed batches (above);") in start
    warned = [line for line in printed.err.splitlines() if "warning:" in line]
    assert warned == [
        f"warning: {workdir}/checkpoints/4: written with {key}={saved}, now {value!r}; the "
        f"training data cannot go on from its saved position and starts a new shuffle "
        f"(seeded from seed 0 and step 4)"]


def test_a_signal_while_the_first_step_compiles_stops_at_once(trained_run, tmp_path,
                                                              monkeypatch):
    """SIGTERM as a start's first step is called stops the run at once, as before training:
    no step, nothing saved; a later one would save after its step. (Sent while XLA compiles,
    it stops the run there: 12 layers on the 2-core CPU, signalled 1 s into a compilation
    of 28 s, ended 0.0 s later.)"""
    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    compile_train_step = Parallel.compile_train_step

    def signalling(self, step_fn, compiler_options=None):
        compiled = compile_train_step(self, step_fn, compiler_options)

        def call(*args):
            os.kill(os.getpid(), signal.SIGTERM)
            return compiled(*args)
        return call

    monkeypatch.setattr(Parallel, "compile_train_step", signalling)
    with pytest.raises(StoppedAtOnce, match="SIGTERM before the first step: stopped at once"):
        train(shared_run(num_train_steps=6), str(workdir))
    with Checkpointer(str(workdir / "checkpoints"), keep=3) as checkpointer:
        assert checkpointer.all_steps() == [2, 4]


class FullDisk:
    """A text file with room for `room` more characters: a write past it writes what
    fits, then fails as on a full disk (ENOSPC)."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def write(self, text: str) -> int:
        if len(text) > self.room:
            self.file.write(text[:self.room])
            self.file.flush()
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(text)
        return self.file.write(text)

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_a_full_disk_while_logging_stops_training_in_one_line_and_a_restart_resumes(
        trained_run, tmp_path, monkeypatch, capsys):
    """metrics.jsonl with room for 30 characters more: step 6's record fails (ENOSPC)
    after 30 of them. Training stops with one MetricsWriteError naming the file, the step
    and the OS error; checkpoints 2 and 4 stay (step 6's save comes after its record).
    Restarted with room again, the run drops the torn line with a warning, resumes at 4."""
    workdir = tmp_path / "run"
    shutil.copytree(trained_run.workdir, workdir)
    logged = (workdir / "metrics.jsonl").read_text()
    monkeypatch.setattr(run_log, "open", lambda path, mode="r", **kwargs: (
        FullDisk(open(path, mode, **kwargs), 30) if mode == "a" else open(path, mode, **kwargs)),
        raising=False)
    with pytest.raises(MetricsWriteError) as caught:
        train(shared_run(num_train_steps=8), str(workdir))
    assert str(caught.value) == (
        f"{workdir}/metrics.jsonl: the record of step 6 could not be written: No space left "
        f"on device (OS error 28); training stopped, and the same command resumes from the "
        f"newest checkpoint")
    torn = (workdir / "metrics.jsonl").read_text()[len(logged):]
    assert len(torn) == 30 and torn.startswith('{"step": 6, "loss": ')
    with Checkpointer(str(workdir / "checkpoints"), keep=3) as checkpointer:
        assert checkpointer.all_steps() == [2, 4]
    monkeypatch.undo()
    capsys.readouterr()
    result = train(shared_run(num_train_steps=8), str(workdir))
    assert [r["step"] for r in result.records] == [6, 8]
    assert (workdir / "metrics.jsonl").read_text().startswith(logged)
    assert [r["step"] for r in records(workdir)] == [2, 4, 6, 8]
    assert capsys.readouterr().err.count("metrics.jsonl: skipped its half-written last line") == 1


def test_non_finite_loss_stops_and_saves_nothing(tmp_path):
    config = tiny_run(num_train_steps=20, log_every_steps=20, checkpoint_every_steps=20,
                      **{"optim.learning_rate_scale": 1e30})
    with pytest.raises(NonFiniteLossError, match=r"the loss is (nan|inf) at step \d+"):
        train(config, str(tmp_path))
    assert Checkpointer(str(tmp_path / "checkpoints"), keep=1).all_steps() == []


@pytest.mark.parametrize("key, value, message", [
    ("num_train_steps", 0, "config.num_train_steps must be a positive integer"),
    ("per_device_batch_size", 3, "must split into config.accumulation_steps=2"),
    ("parallelism", "mpi", "config.parallelism must be one of"),
    ("data.too_long", "wrap", "config.data.too_long"),
    ("model.num_heads", 5, "d_model must be divisible by num_heads=5"),
    ("optim.warmup_steps", 0, "warmup_steps"),
    ("seed", -1, "config.seed must be an integer >= 0"),
    ("num_eval_batches", -2, "config.num_eval_batches must be -1"),
    ("loss_chunk_size", -1, "config.loss_chunk_size must be an integer >= 0"),
    ("data.numbers_size", "medium", "config.data.numbers_size must be one of 'full', 'small'"),
    ("data.max_source_length", 0, "config.data.max_source_length must be an integer >= 2"),
    ("data.max_target_length", 1, "config.data.max_target_length must be an integer >= 2"),
    ("data.num_workers", -1, "config.data.num_workers must be an integer >= 0"),
    ("decode.beam_size", 0, "config.decode.beam_size must be a positive integer"),
    ("decode.alpha", -0.5, "config.decode.alpha must be a non-negative number"),
    ("decode.alpha", float("inf"), "config.decode.alpha must be a non-negative number, got inf"),
    ("decode.max_extra_length", -100, "config.decode.max_extra_length must be a non-negative "
                                      "integer"),
    ("decode.bleu_examples", 0, "config.decode.bleu_examples must be a positive integer"),
    ("model.max_length", 16, "max_length=16 \\(the learned position table\\) is shorter than "
                             "the rows \\(24 tokens\\)"),
    ("model.attention_implementation", "cudnn", "'cudnn' needs"),
])
def test_bad_config_values_name_the_key(key, value, message):
    # Learned positions, so model.max_length matters; float32, which cuDNN refuses everywhere.
    config = tiny_run(accumulation_steps=2, per_device_batch_size=2,
                      **{"model.positional_encoding": "learned"})
    target, name = (config[key.split(".")[0]], key.split(".")[1]) if "." in key else (config, key)
    target[name] = value
    with pytest.raises(ConfigError, match=message):
        check_config(config)


def test_train_names_what_it_takes_for_a_config_of_another_kind(tmp_path):
    """A dict is a config (its keys checked as a ConfigDict's are); another type is one
    TypeError, not an AttributeError from deep in the checks."""
    with pytest.raises(TypeError) as caught:
        train([("num_train_steps", 2)], str(tmp_path))
    assert str(caught.value) == ("a run's config is an ml_collections.ConfigDict "
                                 "(load_config_file, run_config.base_config()) or a dict of its "
                                 "keys, not list")
    misspelt = tiny_run().to_dict()
    misspelt["eval_every_step"] = 1
    with pytest.raises(ConfigError, match=r"^config\.eval_every_step is not a setting \(did "
                                          r"you mean config\.eval_every_steps\?\)"):
        train(misspelt, str(tmp_path))
    assert not os.listdir(tmp_path)


def test_a_new_run_whose_corpus_is_not_there_makes_no_workdir(tmp_path):
    """A folder corpus missing, or without a split's files: one DataError before the new
    run's workdir is made (it held an empty train.lock)."""
    config = tiny_run()
    config.data.dataset = f"folder:{tmp_path / 'gone'}"
    with pytest.raises(DataError, match=rf"^dataset folder '{tmp_path / 'gone'}' does not"):
        train(config, str(tmp_path / "run"))
    (tmp_path / "corpus").mkdir()
    config.data.dataset = f"folder:{tmp_path / 'corpus'}"
    with pytest.raises(DataError, match=r"^missing .*/corpus/train\.de, .*/corpus/train\.en; "):
        train(config, str(tmp_path / "run"))
    assert sorted(os.listdir(tmp_path)) == ["corpus"]


def run_train_py(workdir, *overrides, launch=(), **popen):
    """train.py on the tiny model, in a process that inherits conftest.py's 8 devices: the
    default's 64 rows an update split over them (64 rows a device, 20 steps: 40-44 s of CPU
    time against 23 s; 2-core CPU, 2026-11-30)."""
    command = [sys.executable, *launch, "train.py", "--config=configs/default.py",
               f"--workdir={workdir}", "--config.model.d_model=32", "--config.model.d_ff=64",
               "--config.model.num_layers=1", "--config.data.numbers_size=small",
               f"--config.per_device_batch_size={rows_per_device(64)}",
               "--config.optim.warmup_steps=10", *overrides]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


class _Host:  # the window's device values are already host values here
    to_host = staticmethod(lambda metrics: metrics)


def _step(tokens: float) -> dict:
    return {"loss_sum": 2.0 * tokens, "correct_sum": tokens / 2, "weight_sum": tokens,
            "learning_rate": 1e-3, "grad_norm": 1.0}


def test_a_records_rates_leave_out_the_paused_steps_and_their_time():
    """A first step of 10 tokens that takes 8 s (compiling), then 20 and 30 tokens in 1.5 s:
    2 steps / 1.5 s and 50 tokens / 1.5 s, while the loss and accuracy count all three.
    Then a pause (a trace) across a record: each record rates only its steps outside it."""
    now = [0.0]
    window = MetricsWindow(clock=lambda: now[0])
    window.pause()
    window.pending.append(_step(10))
    now[0] = 8.0
    window.resume()
    window.pending += [_step(20), _step(30)]
    window.fetch(_Host, 3)
    now[0] = 9.5
    record = window.summary()
    assert record["steps_per_sec"] == pytest.approx(2 / 1.5)
    assert record["tokens_per_sec"] == pytest.approx(50 / 1.5)
    assert (record["loss"], record["accuracy"]) == (2.0, 0.5)

    now[0] = 20.0  # after an evaluation: the loop opens a new window
    window.start()
    window.pending.append(_step(10))  # timed
    now[0] = 21.0
    window.pause()
    window.pending.append(_step(10))  # traced
    window.fetch(_Host, 5)
    now[0] = 23.0
    record = window.summary()  # 1 step in 23 - 20 - 2 s
    assert (record["steps_per_sec"], record["tokens_per_sec"]) == (1.0, 10.0)
    window.pending.append(_step(10))  # still traced
    now[0] = 25.0
    window.resume()
    window.pending.append(_step(40))  # timed
    window.fetch(_Host, 7)
    now[0] = 27.0
    record = window.summary()  # 1 step in 27 - 23 - 2 s
    assert (record["steps_per_sec"], record["tokens_per_sec"]) == (0.5, 20.0)
    assert record["loss"] == 2.0


def test_work_between_two_records_leaves_the_rates():
    """Steps of 10 tokens at 1 s, then 2 s, then a 5 s BLEU search or save (not a record),
    then a step at 8 s, then the record: 3 steps in 3 s of training, not in 8 s. Inside a
    pause (a trace), the block leaves the pause on."""
    now = [0.0]
    window = MetricsWindow(clock=lambda: now[0])
    for ended in (1.0, 2.0):
        now[0] = ended
        window.pending.append(_step(10))
    window.fetch(_Host, 2)
    with window.left_out():
        now[0] = 7.0
    now[0] = 8.0
    window.pending.append(_step(10))
    window.fetch(_Host, 3)
    record = window.summary()
    assert (record["steps_per_sec"], record["tokens_per_sec"]) == (1.0, 10.0)
    window.pause()
    with window.left_out():
        now[0] = 9.0
    window.pending.append(_step(10))  # still traced
    window.resume()
    window.fetch(_Host, 4)
    assert "steps_per_sec" not in window.summary()


def test_two_pieces_of_work_in_one_window_both_leave_the_rates():
    """A step at 1 s, a save from 1 to 3 s, a step at 4 s, an evaluation from 4 to 7 s, a
    step at 8 s: 3 steps in the 3 s of training, not in the 5 s left by the last block."""
    now = [0.0]
    window = MetricsWindow(clock=lambda: now[0])
    for step_end, block_end in ((1.0, 3.0), (4.0, 7.0)):
        now[0] = step_end
        window.pending.append(_step(10))
        with window.left_out():
            now[0] = block_end
    now[0] = 8.0
    window.pending.append(_step(10))
    window.fetch(_Host, 3)
    assert window.summary()["steps_per_sec"] == 1.0


def test_a_pause_at_each_traced_step_leaves_out_all_of_them_from_the_first():
    """The loop pauses before each traced step: a step timed 0-1 s (10 tokens), traced
    steps from 1 to 5 s (paused again at 3 s), a step timed 5-6 s (30 tokens). The record
    rates the two timed steps in 2 s, from the first pause on, not from the last."""
    now = [0.0]
    window = MetricsWindow(clock=lambda: now[0])
    window.pending.append(_step(10))
    now[0] = 1.0
    for paused in (1.0, 3.0):
        now[0] = paused
        window.pause()
        window.pending.append(_step(1000))  # traced
    now[0] = 5.0
    window.resume()
    window.pending.append(_step(30))
    window.fetch(_Host, 4)
    now[0] = 6.0
    record = window.summary()
    assert (record["steps_per_sec"], record["tokens_per_sec"]) == (1.0, 20.0)


def test_a_record_weighs_each_step_by_its_tokens_and_keeps_the_last_rate_and_norm():
    """Loss 10 over 10 tokens, then 90 over 30: 100 / 40 = 2.5 per token, not the mean of
    1 and 3; accuracy 5 + 27 of 40. The learning rate and grad_norm are the last step's."""
    window = MetricsWindow()
    window.pending += [{"loss_sum": 10.0, "correct_sum": 5.0, "weight_sum": 10.0,
                        "learning_rate": 1e-3, "grad_norm": 4.0},
                       {"loss_sum": 90.0, "correct_sum": 27.0, "weight_sum": 30.0,
                        "learning_rate": 2e-3, "grad_norm": 3.0}]
    window.fetch(_Host, 2)
    record = window.summary()
    assert (record["loss"], record["accuracy"]) == (2.5, 0.8)
    assert (record["learning_rate"], record["grad_norm"]) == (2e-3, 3.0)


def test_a_non_finite_loss_names_its_step():
    """Steps 6 and 7 fetched at step 7, the second's loss NaN: "at step 7"."""
    window = MetricsWindow()
    window.pending += [_step(10), {**_step(10), "loss_sum": math.nan}]
    with pytest.raises(NonFiniteLossError, match=r"^the loss is nan at step 7; "):
        window.fetch(_Host, 7)


def test_an_infinite_loss_stops_too_and_names_the_first_bad_step():
    """An infinite loss stops as NaN does; steps 6 and 7 fetched at step 7, the first's
    loss NaN: "at step 6", the step it was, not the step fetched at."""
    window = MetricsWindow()
    window.pending += [_step(10), _step(10), {**_step(10), "loss_sum": math.inf}]
    with pytest.raises(NonFiniteLossError, match=r"^the loss is inf at step 3; "):
        window.fetch(_Host, 3)
    window = MetricsWindow()
    window.pending += [{**_step(10), "loss_sum": math.nan}, _step(10)]
    with pytest.raises(NonFiniteLossError, match=r"^the loss is nan at step 6; "):
        window.fetch(_Host, 7)


def test_a_pause_waits_for_the_steps_dispatched_before_it():
    """Dispatch runs ahead of the device: a step dispatched at 0 s that the device ends at
    5 s is timed 5 s, though the pause (a trace starting) comes at 1 s."""
    now = [0.0]

    class Running(float):  # a step's device value, done when waited for
        def block_until_ready(self):
            now[0] = 5.0
            return self

    window = MetricsWindow(clock=lambda: now[0])
    window.pending.append({**_step(10), "loss_sum": Running(20.0)})
    now[0] = 1.0
    window.pause()
    window.pending.append(_step(10))
    now[0] = 9.0
    window.resume()
    window.fetch(_Host, 2)
    assert window.summary()["steps_per_sec"] == 1 / 5.0


def test_a_record_of_left_out_steps_alone_has_no_rates():
    """log_every_steps=1: the first record holds only the compiling step; rather than a
    rate that is mostly compiling, it has none."""
    window = MetricsWindow()
    window.pause()
    window.pending.append(_step(10))
    window.resume()
    window.fetch(_Host, 1)
    record = window.summary()
    assert "steps_per_sec" not in record and "tokens_per_sec" not in record
    assert record["loss"] == 2.0


def test_a_record_of_steps_without_target_tokens_is_zero_not_a_division_by_zero():
    """Two steps whose rows were all padding (weight 0) in 2 s: loss and accuracy 0, no
    ZeroDivisionError that would end the run; 0 tokens and 1 step a second."""
    now = [0.0]
    window = MetricsWindow(clock=lambda: now[0])
    window.pending += [{**_step(0.0), "loss_sum": 0.0}] * 2
    window.fetch(_Host, 2)
    now[0] = 2.0
    record = window.summary()
    assert (record["loss"], record["accuracy"]) == (0.0, 0.0)
    assert (record["steps_per_sec"], record["tokens_per_sec"]) == (1.0, 0.0)


def test_sigterm_saves_and_exits_cleanly_and_the_restart_loads_the_compiled_step(tmp_path):
    """SIGTERM to the run's process group, its 2 grain workers too (as Ctrl-C in a terminal
    or a scheduler's preemption sends it): the current step finishes, a checkpoint is
    saved, exit status 0, no traceback. The restart trains one more step with the train
    step loaded from WORKDIR/compilation_cache, not compiled again, and restores the state
    without drawing fresh parameters first."""
    cache_everything = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    process = run_train_py(tmp_path, "--config.num_train_steps=100000",
                           "--config.log_every_steps=1", "--config.data.num_workers=2",
                           start_new_session=True, env=cache_everything)
    deadline = time.time() + 240
    while not (tmp_path / "metrics.jsonl").exists() or len(records(tmp_path)) < 3:
        assert process.poll() is None and time.time() < deadline, process.communicate()
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    assert process.returncode == 0 and "Traceback" not in err, err
    stopped = [line for line in (out + err).splitlines() if "stopped at step" in line]
    step = int(stopped[0].split("stopped at step ")[1].split(";")[0])
    assert f"saved to {tmp_path / 'checkpoints'}/{step}" in stopped[0]
    assert step in Checkpointer(str(tmp_path / "checkpoints"), keep=5).all_steps()
    entries = sorted((tmp_path / "compilation_cache").iterdir(), key=lambda p: p.stat().st_size)
    compiled = {path.name.split("-")[0] for path in entries}
    launched = time.monotonic()
    restart = run_train_py(tmp_path, f"--config.num_train_steps={step + 1}",
                           "--config.num_eval_batches=0", "--config.decode.bleu_every_steps=0",
                           env={**cache_everything, "JAX_LOG_COMPILES": "1"})
    out, err = restart.communicate(timeout=240)
    ran = time.monotonic() - launched
    assert restart.returncode == 0, err
    # The first step's line counts from the process's start, in four parts that add up.
    first = re.search(rf"step {step + 1} done ([\d.]+) s after the process started: ([\d.]+) s "
                      r"starting Python, the imports and the devices, ([\d.]+) s reading or "
                      r"preparing the data, ([\d.]+) s restoring the state, ([\d.]+) s "
                      r"compiling and running the step", out + err)
    assert first, out + err
    total, *parts = map(float, first.groups())
    assert parts[0] > 0.1 and abs(sum(parts) - total) <= 0.2 and total <= ran
    loaded = set(re.findall(r"Persistent compilation cache hit for '(\w+)'", err))
    # The largest program is the train step (whatever JAX names it: 'jit__fun' under pmap).
    biggest = entries[-1].name.split("-")[0]
    assert biggest in loaded <= compiled, (loaded, compiled)
    # A restart restores the state into its shapes: it draws no parameters to overwrite.
    assert "_compiled_init_params" not in err and "jit__compiled_init_params" in compiled


# Sends SIGTERM 0.2 s into the first large XLA compilation, which looks for signals in C++.
STOP_WHILE_COMPILING = """
import os, runpy, signal, sys, threading
import jax
import ml_collections

def stop_while_compiling(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" and duration > 0.06 and not sent:
        sent.append(threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)))
        sent[0].start()  # lowered: XLA compiles it next, for seconds

sent = []
jax.monitoring.register_event_duration_secs_listener(stop_while_compiling)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("when", ["once it holds the workdir", "while XLA compiles"])
def test_sigterm_during_setup_stops_at_once_with_one_line(tmp_path, when):
    """SIGTERM before any step (data, tokenizer and the step's compilation take seconds):
    exit 1, one line, nothing saved. Inside a compilation too, where a normal exit of the
    interpreter would crash (SIGSEGV)."""
    if when == "while XLA compiles":
        # One CPU device, as a user's run has: there, a normal exit crashes every time.
        process = run_train_py(tmp_path, launch=("-c", STOP_WHILE_COMPILING),
                               env={**os.environ, "XLA_FLAGS": ""})
    else:
        process = run_train_py(tmp_path)
        deadline = time.time() + 120
        while str(process.pid) not in _read(tmp_path / "train.lock"):
            assert process.poll() is None and time.time() < deadline, process.communicate()
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "Traceback" not in err, err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("error: SIGTERM before the first step: stopped at once"), err
    assert not (tmp_path / "checkpoints").exists() or not os.listdir(tmp_path / "checkpoints")


def _read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_train_py_rejects_bad_config_before_compiling(tmp_path):
    (tmp_path / "broken.py").write_text("def get_config(:\n")
    for flag, message in (("--config.num_train_steps=0", "config.num_train_steps must be"),
                          ("--config.num_train_stepz=5", "num_train_stepz"),
                          ("--config=configs/missing.py", "No such file or directory"),
                          ("configs/default.py", "error: unexpected arguments "
                                                 "'configs/default.py': flags are --name=value"),
                          (f"--config={tmp_path / 'broken.py'}", "(broken.py, line 1)")):
        process = run_train_py(tmp_path / "run", flag)
        out, err = process.communicate(timeout=120)
        assert process.returncode != 0 and message in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()  # nothing was started
    # Without --config (configs/default.py), where ml_collections applies overrides at import;
    # from another folder, the one beside train.py.
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), f"--workdir={tmp_path / 'run'}",
                           "--config.num_train_stepz=5"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == ("error in the command line: --config.num_train_stepz: config "
                                   "has no key 'num_train_stepz'; did you mean 'num_train_steps'?")


def test_a_token_budget_too_small_is_refused_before_the_data_is_read(tmp_path):
    """The rows a budget holds depend on the devices, known only when training starts: the
    check comes then, before the tokenizer is trained or the data prepared."""
    config = tiny_run(per_device_batch_size=0, accumulation_steps=4)
    longest = max(config.data.max_source_length, config.data.max_target_length)
    config.data.update(tokens_per_batch=2 * longest)  # 2 rows; 4 micro-batches need 4
    with pytest.raises(ConfigError, match=rf"tokens_per_batch={2 * longest} holds no \d+ rows "
                                          rf"of {longest} tokens"):
        train(config, str(tmp_path / "run"))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["train.lock"]


def test_workdir_must_be_a_writable_folder(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OutputPathError, match="is a file, not a folder"):
        writable_folder(str(tmp_path / "a_file"))
    with pytest.raises(OutputPathError, match="/proc/x_workdir is not a writable folder"):
        writable_folder("/proc/x_workdir")  # /proc refuses new entries, even to root
    assert writable_folder(str(tmp_path / "new" / "run")) == str(tmp_path / "new" / "run")
    assert (tmp_path / "new" / "run").is_dir()


@pytest.mark.parametrize("why", ["num_eval_batches=0", "the validation split is empty"])
def test_no_evaluation_data_logs_no_eval_records(tmp_path, capsys, monkeypatch, why):
    """No evaluation data: one line says there is nothing to evaluate; no eval_* records.
    The folder corpus, given by a relative path, is recorded by its absolute one (by the
    tokenizer, the prepared ids and the checkpoint), so that later commands find it from
    any folder; the caller's config is left as it was. A dict of the config's keys and a
    FrozenConfigDict train as the ConfigDict does."""
    config = tiny_run(num_train_steps=2, eval_every_steps=1)
    if why == "num_eval_batches=0":
        config.num_eval_batches = 0
    else:  # a folder corpus with an empty validation split
        corpus = tmp_path / "corpus"
        corpus.mkdir()
        for split, count in (("train", 60), ("validation", 0), ("test", 5)):
            for lang, word in (("de", "Satz"), ("en", "sentence")):
                (corpus / f"{split}.{lang}").write_text(
                    "".join(f"{word} {i}\n" for i in range(count)))
        monkeypatch.chdir(tmp_path)
        config.data.dataset, config.data.vocab_size = "folder:corpus", 300
        config.decode.bleu_every_steps = 1  # nor BLEU, which reads the same split
    given = (ml_collections.FrozenConfigDict(config) if why == "num_eval_batches=0" else
             config.to_dict())
    train(given, str(tmp_path / "run"))
    assert [sorted(r) for r in records(tmp_path / "run")] == [
        ["accuracy", "elapsed_s", "grad_norm", "learning_rate", "loss", "step",
         "steps_per_sec", "tokens_per_sec"]]
    printed = "".join(capsys.readouterr())
    assert printed.count(f"nothing to evaluate ({why})") == 1
    if why != "num_eval_batches=0":
        assert given["data"]["dataset"] == "folder:corpus"
        run = tmp_path / "run"
        recorded = [json.loads((run / "tokenizer.model.json").read_text()),
                    json.loads((run / "prepared" / "train" / "manifest.json").read_text())[
                        "made_from"],
                    json.loads(next(run.glob("checkpoints/*/metadata/metadata")).read_text())[
                        "config"]["data"]]
        assert [r["dataset"] for r in recorded] == [f"folder:{corpus}"] * 3


needs_gpu = pytest.mark.skipif(jax.default_backend() != "gpu",
                               reason="trains on an NVIDIA GPU; this backend is the CPU")


@needs_gpu
def test_bfloat16_training_tracks_float32_then_evaluates_and_restores_on_cpu(tmp_path):
    """On a GPU: 300 steps of configs/default.py in bfloat16 stay within 10% of float32's
    label-smoothed cross-entropy at every logged step; evaluate.py scores the bfloat16 run;
    the float32 run's GPU checkpoint translates on the CPU (another process,
    JAX_PLATFORMS=cpu) exactly as on the GPU."""
    from transformer_jax.translation import Translator

    def run(dtype):
        config = load_config("default")
        config.num_train_steps, config.log_every_steps = 300, 50
        config.eval_every_steps = config.checkpoint_every_steps = 300
        config.model.dtype = dtype
        return train(config, str(tmp_path / dtype)).records

    logged = {dtype: [r["loss"] for r in run(dtype)] for dtype in ("float32", "bfloat16")}
    # The logged loss is the cross-entropy against the smoothed target q minus q's entropy
    # (losses.py), which falls to about 0 on this data, where 10% of it is noise (on an H100
    # float32's last 50 steps averaged 0.080, bfloat16's 0.038, after 0.045 and 0.044). The
    # cross-entropy of §5.4 itself keeps H(q) and so a scale: compare that.
    eps = load_config("default").optim.label_smoothing
    on_cpu_too = Translator.from_workdir(str(tmp_path / "float32"))
    vocab = on_cpu_too.tokenizer.vocab_size
    entropy = -(1 - eps) * math.log(1 - eps) - eps * math.log(eps / (vocab - 1))
    losses = {dtype: [loss + entropy for loss in values] for dtype, values in logged.items()}
    assert len(losses["float32"]) == len(losses["bfloat16"]) == 6
    assert logged["float32"][-1] < 0.1 * logged["float32"][0]  # it learned
    gaps = [abs(b - f) / f for f, b in zip(losses["float32"], losses["bfloat16"])]
    assert max(gaps) <= 0.1, (logged, gaps)

    done = subprocess.run([sys.executable, "evaluate.py", f"--workdir={tmp_path / 'bfloat16'}",
                           "--split=validation"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    scores = json.loads((tmp_path / "bfloat16" / "eval" / "validation-300.json").read_text())
    assert scores["bleu"] > 0 and scores["sentences"] == 2000

    numbers = ["einundzwanzig", "dreihundertvierzehn", "neunzehn", "zweitausendeins"]
    on_gpu = on_cpu_too.translate(numbers, beam_size=1)
    done = subprocess.run([sys.executable, "translate.py", f"--workdir={tmp_path / 'float32'}",
                           "--beam_size=1"], input="\n".join(numbers) + "\n", cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == on_gpu


def test_a_run_already_at_its_last_step_says_there_is_nothing_to_train(trained_run, tmp_path,
                                                                       capsys):
    """Starting a finished run (or one asked for fewer steps than it has) trains nothing and
    says so in one line naming the checkpoint and num_train_steps, with no progress bar
    (it drew an empty one around each line)."""
    shutil.copytree(trained_run.workdir, tmp_path / "run")
    last = trained_run.config.num_train_steps
    before = files(tmp_path / "run")
    result = train(trained_run.config, str(tmp_path / "run"))
    assert (result.step, result.records, result.stopped_early) == (last, [], False)
    out, err = capsys.readouterr()
    assert f"nothing to train: {tmp_path / 'run'}/checkpoints/{last} is at step {last}, " \
           f"and num_train_steps is {last}" in out
    assert "trained to step" not in out  # it trained nothing: no last line of a training
    assert "train:" not in err, err
    assert files(tmp_path / "run")["metrics.jsonl"] == before["metrics.jsonl"]


@pytest.mark.skipif(jax.device_count() < 2, reason="needs a mesh of 2 or more devices; this "
                    "backend has one")
def test_the_pallas_layer_norm_is_refused_on_a_sharded_mesh(tmp_path):
    """Its kernels see one device's rows: over a mesh XLA would gather every row to each
    device. pmap runs them per device; the refusal comes before the data is prepared."""
    config = tiny_run(parallelism="sharded", **{"model.layer_norm_implementation": "pallas"})
    with pytest.raises(ConfigError, match="'pallas' runs on one device's rows; with "
                                          "parallelism='sharded' over 8 devices use"):
        train(config, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "tokenizer.model").exists()
    assert not (tmp_path / "run" / "prepared").exists()


def test_the_pallas_layer_norm_trains_off_a_gpu_with_a_warning(tmp_path, capsys):
    """Off a GPU its kernels are interpreted: the run says so once, and trains as with
    Flax's norm (the same losses, logged to 4 digits)."""
    losses = {}
    for implementation in ("xla", "pallas"):
        config = shared_run(num_train_steps=2, log_every_steps=1,
                            **{"model.layer_norm_implementation": implementation,
                               "model.num_layers": 1})
        records = train(config, str(tmp_path / implementation)).records
        losses[implementation] = [r["loss"] for r in records]
        out = capsys.readouterr()
        warned = "'pallas' runs its kernels in Pallas's interpreter on cpu" in \
            out.out + out.err
        assert warned == (implementation == "pallas" and jax.default_backend() != "gpu")
    assert len(losses["xla"]) == 2  # on a GPU the kernels are Triton's: float32 rounding
    np.testing.assert_allclose(losses["pallas"], losses["xla"], rtol=1e-5)


def test_an_empty_workdir_is_refused_not_the_current_directory(tmp_path, monkeypatch):
    """`--workdir=$RUN` with RUN unset: os.path.abspath("") is the current directory, where
    the run would have gone."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputPathError) as caught:
        train(tiny_run(), "")
    assert str(caught.value) == "--workdir is empty (an unset shell variable?); name a folder"
    assert os.listdir(tmp_path) == []


def test_the_start_line_counts_every_processs_rows_and_names_the_software(monkeypatch):
    """Two processes of 8 rows each: 16 packed rows per update, "in 2 processes"; the
    commit to 12 characters with its +dirty; a resumed run says where it resumed."""
    from transformer_jax import run_messages
    from transformer_jax.run_config import build_model_config

    config = tiny_run(num_train_steps=100)
    model_config = build_model_config(config.model, vocab_size=config.data.vocab_size)
    software = {"commit": "0123456789abcdef+dirty", "transformer_jax": "0.1.0", "jax": "0.10.2"}
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    line = run_messages.start_line(config, model_config, rows=8, software=software, first=40,
                                   parameters=1234567)
    devices = len(jax.devices())
    assert line == (
        f"resumed at step 40; training steps 41-100: 1,234,567 parameters (1 layer of width "
        f"32, float32) on {devices} {jax.devices()[0].device_kind} device"
        f"{'s' * (devices != 1)} in 2 processes, {config.parallelism}; 16 packed rows of "
        f"12 + 24 tokens per update; transformer_jax 0.1.0 (0123456789ab+dirty), jax 0.10.2")


def test_the_opening_lines_say_what_the_run_will_and_will_not_do():
    """Resumed at its last step: the nothing-to-train line alone (no "training steps 5-4");
    one step before it, the start line alone. num_eval_batches=-1 is the whole split: no
    "nothing to evaluate"; 0 is none, said once."""
    from transformer_jax import run_messages
    from transformer_jax.run_config import build_model_config

    config = tiny_run(num_train_steps=4)
    model_config = build_model_config(config.model, vocab_size=config.data.vocab_size)
    software = {"commit": None, "transformer_jax": "0.1.0", "jax": "0.10.2"}

    def lines(first, **overrides):
        return run_messages.opening_lines(
            tiny_run(num_train_steps=4, **overrides), model_config, rows=8, software=software,
            first=first, parameters=10, evaluable=True, checkpoints="W/checkpoints")

    assert lines(4) == ["nothing to train: W/checkpoints/4 is at step 4, and num_train_steps "
                        "is 4 (raise --config.num_train_steps to train on)"]
    (start,) = lines(3, num_eval_batches=-1)
    assert start.startswith("resumed at step 3; training steps 4-4: 10 parameters")
    assert lines(3, num_eval_batches=0)[1:] == [
        "nothing to evaluate (num_eval_batches=0): the run logs no eval_loss, eval_accuracy "
        "or eval_perplexity"]


def test_the_first_steps_line_splits_its_time_between_its_parts(monkeypatch):
    """Started at 1 s (launched at 0.5), the data read by 2.5, the state built by 6 (1.2 s of
    it drawing), the step done at 10: each part is its own stretch of that time."""
    from transformer_jax import run_messages

    monkeypatch.setattr(run_messages, "time", types.SimpleNamespace(monotonic=lambda: 10.0))
    assert run_messages.first_step_line(1, (0.5, 1.0), 2.5, 6.0, 1.2) == (
        "step 1 done 9.5 s after the process started: 0.5 s starting Python, the imports and "
        "the devices, 1.5 s reading or preparing the data, 3.5 s building the state (1.2 s of "
        "it compiling and drawing its parameters), 4.0 s compiling and running the step")
    assert run_messages.first_step_line(7, (None, 1.0), 2.5, 6.0, None) == (
        "step 7 done 9.0 s after the start: 1.5 s reading or preparing the data, 3.5 s "
        "restoring the state, 4.0 s compiling and running the step")


def test_the_profile_line_gives_the_device_time_per_step_and_the_top_three():
    from transformer_jax import run_messages

    summary = {"first_step": 11, "last_step": 30, "trace": "/w/plugins/profile/r",
               "wall_ms_per_step": 12.34, "busy_ms_per_step": 9.87, "idle_share": 0.2,
               "operations": [{"operation": f"op{i}", "share": 0.4 - 0.1 * i}
                              for i in range(4)],
               "parts": [{"pass": "forward", "part": "attention", "share": 0.5},
                         {"pass": "backward", "part": "feed-forward", "share": 0.25}]}
    assert run_messages.profile_line(summary) == (
        "profiled steps 11-30 into /w/plugins/profile/r: 12.3 ms per step, the device busy "
        "9.9 ms and idle 20% of it; most time in op0 40%, op1 30%, op2 20%; by part: forward "
        "attention 50%, backward feed-forward 25% (summary.json there)")


def test_a_window_opened_inside_a_pause_leaves_out_only_its_own_paused_time():
    """A trace across a record and an evaluation: the record at 23 s, the evaluation to 28 s
    (left out), the window opened then, one traced step, the trace's end at 30 s, then a
    step timed to 31 s. The record rates 1 step in 1 s: the evaluation's 5 s before the
    window opened are not subtracted from it."""
    now = [20.0]
    window = MetricsWindow(clock=lambda: now[0])
    window.pause()
    window.pending.append(_step(10))
    window.fetch(_Host, 1)
    now[0] = 23.0
    window.summary()
    now[0] = 28.0  # after the evaluation
    window.start()
    window.pending.append(_step(10))  # traced
    now[0] = 30.0
    window.resume()
    window.pending.append(_step(20))  # timed
    now[0] = 31.0
    window.fetch(_Host, 3)
    record = window.summary()
    assert (record["steps_per_sec"], record["tokens_per_sec"]) == (1.0, 20.0)


def test_periodic_work_is_due_every_n_steps_and_at_the_last():
    """Every 4 steps of 10 and at step 10, the last; never with 0 (off)."""
    from transformer_jax.trainer import _due

    assert [step for step in range(1, 11) if _due(step, 4, 10)] == [4, 8, 10]
    assert [step for step in range(1, 11) if _due(step, 1, 10)] == list(range(1, 11))
    assert not any(_due(step, 0, 10) for step in range(1, 11))


def a_loop(config, **attributes):
    """A training loop's state without its model, data or compiled steps: for the work it
    does between steps, with fakes of what that work calls."""
    from transformer_jax.trainer import _Loop

    loop = _Loop.__new__(_Loop)
    loop.config, loop.workdir = config, "W"
    loop.checkpointer = types.SimpleNamespace(directory="W/checkpoints")
    loop.parallel = types.SimpleNamespace(put_batch=lambda batch: batch,
                                          to_host=lambda sums: sums,
                                          local_params=lambda placed: placed.params)
    loop.__dict__.update(attributes)
    return loop


def test_a_stop_logs_and_saves_but_evaluates_nothing():
    """The work between steps, in order: log, evaluate, BLEU, save. At a stop signal's
    step (5, due for none of them) the record is logged and the state saved, not
    evaluated; at step 4 all four run; num_eval_batches=0 turns evaluation off."""
    config = tiny_run(num_train_steps=10, log_every_steps=2, eval_every_steps=4,
                      checkpoint_every_steps=4, **{"decode.bleu_every_steps": 4})
    loop = a_loop(config, eval_pairs=[{"source": "eins", "target": "one"}])
    work = loop._periodic_work(log=None, records=[])
    assert [w.every for w in work] == [2, 4, 4, 4]
    assert work[3].run == loop._save
    assert [w.due(4, 10, stopped=False) for w in work] == [True] * 4
    assert [w.due(5, 10, stopped=True) for w in work] == [True, False, False, True]
    assert [w.due(5, 10, stopped=False) for w in work] == [False] * 4
    config.num_eval_batches = 0
    assert [w.every for w in loop._periodic_work(log=None, records=[])] == [2, 0, 4, 4]


def test_an_evaluation_reads_num_eval_batches_of_the_updates_rows_and_weighs_by_tokens(
        monkeypatch):
    """5 validation batches of 10, 20, 30, 40, 50 target tokens; num_eval_batches=3 reads
    the first 3, each of the update's rows (24 here, not the rows per device): loss
    (10 + 20 + 60) / 60 tokens = 1.5, accuracy (5 + 10 + 15) / 60 = 0.5. -1 reads all 5."""
    from transformer_jax import trainer

    sums = [{"loss_sum": loss, "weight_sum": 10.0 * (i + 1), "correct_sum": 5.0 * (i + 1)}
            for i, loss in enumerate([10.0, 20.0, 60.0, 1000.0, 1000.0])]
    asked, evaluated = [], []

    def validation_batches(split, *, batch_size, **kwargs):
        asked.append((split, batch_size))
        for i in range(5):
            yield {"inputs": np.full((1, 2), i), "targets": np.full((1, 2), i),
                   "inputs_segmentation": np.ones((1, 2))}

    def p_eval(params, batch):
        assert params == "params" and sorted(batch) == ["inputs", "targets"]
        evaluated.append(int(batch["inputs"][0, 0]))
        return sums[evaluated[-1]]

    monkeypatch.setattr(trainer, "eval_batches", validation_batches)
    config = tiny_run(num_eval_batches=3, per_device_batch_size=3)
    loop = a_loop(config, rows=24, validation="the split", p_eval=p_eval)
    placed = types.SimpleNamespace(params="params")
    assert loop._evaluate(placed) == {"eval_loss": 1.5, "eval_accuracy": 0.5,
                                      "eval_perplexity": math.exp(1.5)}
    assert asked == [("the split", 24)] and evaluated == [0, 1, 2]
    config.num_eval_batches = -1
    assert loop._evaluate(placed)["eval_loss"] == 2090.0 / 150.0
    assert evaluated[3:] == [0, 1, 2, 3, 4]


def named_on_resume(capsys, model, saved, config, saved_layout, layout) -> str:
    """What a loop of `config`, `model` and `layout` says on stderr when it resumes a
    checkpoint of step 4 saved with `saved` (a run config) and `saved_layout`."""
    loop = a_loop(config, model=Transformer(model), metadata={"layout": layout})
    loop._name_changes(4, {"model": dataclasses.asdict(model), "config": saved.to_dict(),
                           "layout": saved_layout})
    return capsys.readouterr().err


def test_a_resume_names_the_seed_the_micro_batches_and_the_rows_contents_changed(capsys):
    """Saved with seed 0, one micro-batch and too_long='truncate'; resumed with seed 1, two
    and 'drop': one line names the three (each changes what the steps learn from)."""
    model = get_model_config("tiny", num_layers=1, vocab_size=512)
    layout = {"rows_per_update": 8, "devices": 8, "parallelism": "pmap"}
    config = tiny_run(seed=1, accumulation_steps=2, per_device_batch_size=2,
                      **{"data.too_long": "drop"})
    assert named_on_resume(capsys, model, tiny_run(), config, layout, layout) == (
        "resuming W/checkpoints/4 with config.seed=0, now 1; config.accumulation_steps=1, "
        "now 2; data.too_long='truncate', now 'drop' (the steps from here learn with the new "
        "values)\n")


def test_attention_dropout_alone_makes_pmaps_device_count_a_change_to_name(capsys):
    """No dropout on the sublayers but some in attention: pmap on 8 devices, then on 4,
    draws other attention masks, and the resume names it; with no dropout at all, not."""
    model = get_model_config("tiny", num_layers=1, vocab_size=512, dropout_rate=0.0,
                             attention_dropout_rate=0.1, attention_implementation="reference")
    now = {"rows_per_update": 8, "devices": 4, "parallelism": "pmap"}
    saved = {**now, "devices": 8}
    assert named_on_resume(capsys, model, tiny_run(), tiny_run(), saved, now) == (
        "resuming W/checkpoints/4 with dropout drawn by pmap on 8 devices, now pmap on 4 "
        "(the steps from here learn with the new values)\n")
    # With neither dropout, nothing is drawn: the same resume names nothing.
    model = dataclasses.replace(model, attention_dropout_rate=0.0)
    assert named_on_resume(capsys, model, tiny_run(), tiny_run(), saved, now) == ""


def test_a_new_shuffle_is_seeded_from_the_seed_and_the_restored_step(capsys):
    """A data position the iterator cannot take: the data starts again on the shuffle of
    new_shuffle_seed(seed, step), not on the seed's own (which replays the first steps)."""
    from transformer_jax.checkpoint import DataPositionError
    from transformer_jax.train_batches import new_shuffle_seed

    made = []
    loop = a_loop(tiny_run(seed=3), data=iter([]),
                  _batches=lambda seed, announce=True: made.append((seed, announce)))
    loop._new_shuffle(6, DataPositionError(6, "W/checkpoints/6", "no data position saved"),
                      {"config": tiny_run(seed=3).to_dict()})
    assert made == [(new_shuffle_seed(3, 6), False)] and new_shuffle_seed(3, 6) != 3
    assert capsys.readouterr().err == (
        "warning: W/checkpoints/6: no data position saved; the training data cannot go on "
        "from its saved position and starts a new shuffle (seeded from seed 3 and step 6)\n")


def test_bleu_while_training_searches_the_first_bleu_examples_pairs(monkeypatch):
    """decode.bleu_examples=3 of 5 validation pairs: the search runs on the first 3
    sources with the decode settings, and they are scored against their 3 targets."""
    from transformer_jax import trainer

    config = tiny_run(**{"decode.bleu_examples": 3, "decode.beam_size": 2,
                         "decode.alpha": 0.3, "decode.max_extra_length": 7})
    pairs = [{"source": f"s{i}", "target": f"t{i}"} for i in range(5)]
    searched = {}

    def predict(model, params, sources, **settings):
        searched.update(model=model, params=params, sources=sources, **settings)
        return [f"out {s}" for s in sources]

    scored = []
    monkeypatch.setattr(trainer, "predict", predict)
    monkeypatch.setattr(trainer, "score", lambda hypotheses, references: scored.append(
        (hypotheses, references)) or {"bleu": 12.5, "chrf": 40.0})
    tokenizer = types.SimpleNamespace(
        encode_batch=lambda texts, add_eos: [t + "</s>" * add_eos for t in texts],
        decode_batch=lambda outputs: outputs)
    loop = a_loop(config, eval_pairs=pairs, tokenizer=tokenizer, model="the model")
    assert loop._bleu(types.SimpleNamespace(params="params")) == {"eval_bleu": 12.5,
                                                                   "eval_chrf": 40.0}
    assert searched == {"model": "the model", "params": "params",
                        "sources": ["s0</s>", "s1</s>", "s2</s>"], "beam_size": 2, "alpha": 0.3,
                        "max_extra_length": 7}
    assert scored == [(["out s0</s>", "out s1</s>", "out s2</s>"], ["t0", "t1", "t2"])]


def test_a_resumed_runs_first_step_is_left_out_of_its_rates():
    """Resumed at step 3: its first step, 4, compiles (10 s), and 5 and 6 take 1 s each.
    The record after step 6 rates those two alone, 2 steps and 40 tokens in 2 s, while its
    loss counts all three steps, as a new run's first step is left out."""
    now = [100.0]

    def p_train(placed, batch):
        now[0] += 10.0 if batch == "batch 4" else 1.0
        return placed, _step(20.0)

    said = []
    log = types.SimpleNamespace(message=said.append, first_step_done=said.append)
    trace = types.SimpleNamespace(tracing=False, before=lambda step: None,
                                  after=lambda step, metrics, **kwargs: None)
    stop = types.SimpleNamespace(check=lambda: None, requested=False, training=False)
    loop = a_loop(tiny_run(num_train_steps=6), p_train=p_train,
                  data=iter(f"batch {step}" for step in (4, 5, 6)),
                  _window=MetricsWindow(clock=lambda: now[0]))
    assert loop._loop(stop, "state", 3, log, trace, work=[],
                      first_line=lambda step: f"first step {step}") == (6, False)
    assert said == ["first step 4", 4] and stop.training
    loop._window.fetch(_Host, 6)
    record = loop._window.summary()
    assert (record["steps_per_sec"], record["tokens_per_sec"]) == (1.0, 20.0)
    assert record["loss"] == 2.0
