"""translate.py and evaluate.py on a tiny trained run; checkpoint averaging; sacreBLEU."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
import sacrebleu

from run_configs import ROOT, tiny_run
from transformer_jax.data import load_split
from transformer_jax.trainer import train
from transformer_jax.translation import TranslationError, Translator, average_params, score

SENTENCES = ["dreihundertzweiundvierzig", "einundzwanzigtausendfünf", "null"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """4 steps of the tiny run, checkpoints at steps 2 and 4."""
    path = tmp_path_factory.mktemp("run")
    train(tiny_run(num_train_steps=4, checkpoint_every_steps=2), str(path))
    return path


def run(script, *args, stdin=None):
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_translate_stdin_and_files_agree_with_the_library(workdir, tmp_path):
    expected = Translator.from_workdir(str(workdir)).translate(SENTENCES)
    by_pipe = run("translate.py", f"--workdir={workdir}", stdin="\n".join(SENTENCES) + "\n")
    assert by_pipe.returncode == 0, by_pipe.stderr
    assert by_pipe.stdout.splitlines() == expected
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    by_file = run("translate.py", f"--workdir={workdir}", f"--input={tmp_path / 'in.txt'}",
                  f"--output={tmp_path / 'out.txt'}", "--beam_size=1")
    assert by_file.returncode == 0, by_file.stderr
    greedy = Translator.from_workdir(str(workdir)).translate(SENTENCES, beam_size=1)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == greedy


def test_translate_errors_are_one_line(workdir, tmp_path):
    for args, message in (([f"--workdir={tmp_path}"], "has no checkpoints"),
                          ([f"--workdir={workdir}", "--checkpoint=average:5"],
                           "average:5 needs 5 checkpoints; there are 2"),
                          ([f"--workdir={workdir}", "--checkpoint=3"], "use latest, a step (2, 4)"),
                          ([f"--workdir={workdir}", f"--input={tmp_path / 'missing.txt'}"],
                           "missing.txt")):
        result = run("translate.py", *args, stdin="")
        assert result.returncode == 1 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_average_of_the_last_two_checkpoints(workdir):
    latest = Translator.from_workdir(str(workdir), "latest")
    earlier = Translator.from_workdir(str(workdir), "2")
    averaged = Translator.from_workdir(str(workdir), "average:2")
    assert averaged.steps == [2, 4] and latest.steps == [4]
    jax.tree.map(lambda a, x, y: np.testing.assert_allclose(a, (x + y) / 2, rtol=1e-6, atol=1e-7),
                 averaged.params, latest.params, earlier.params)
    assert average_params([{"w": np.array([1.0, 3.0])}, {"w": np.array([3.0, 5.0])}])["w"].tolist() == [2.0, 4.0]


def test_evaluate_writes_hypotheses_and_scores(workdir):
    result = run("evaluate.py", f"--workdir={workdir}", "--split=validation", "--beam_size=2")
    assert result.returncode == 0, result.stderr
    assert "sacreBLEU signature: nrefs:1|case:mixed" in result.stdout
    record = json.loads((workdir / "eval" / "validation-4.json").read_text())
    hypotheses = (workdir / "eval" / "validation-4.hyp.txt").read_text(encoding="utf-8").splitlines()
    references = [p["target"] for p in load_split(tiny_run().data, "validation").pairs]
    assert len(hypotheses) == len(references) == record["sentences"]
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert record["beam_size"] == 2 and record["direction"] == "de-en" and record["step"] == 4
    assert record["sentences_per_sec"] > 0


def test_score_is_cased_sacrebleu():
    same = score(["Three hundred and two"], ["Three hundred and two"])
    assert same["bleu"] == pytest.approx(100.0) and same["chrf"] == pytest.approx(100.0)
    assert score(["three hundred and two"], ["Three hundred and two"])["bleu"] < 100.0
    assert "case:mixed" in same["signature"]


def test_missing_checkpoint_dir_raises(tmp_path):
    with pytest.raises(TranslationError, match="no checkpoints"):
        Translator.from_workdir(str(tmp_path))


def test_bleu_while_training_matches_evaluating_the_checkpoint(tmp_path):
    """eval_bleu at step 2 equals sacreBLEU of the saved step-2 model on the same 16 pairs."""
    config = tiny_run(num_train_steps=2, checkpoint_every_steps=2,
                      **{"decode.bleu_every_steps": 2, "decode.bleu_examples": 16,
                         "decode.beam_size": 2})
    train(config, str(tmp_path))
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    bleu_records = [r for r in logged if "eval_bleu" in r]
    assert [r["step"] for r in bleu_records] == [2] and "eval_loss" in bleu_records[0]
    pairs = load_split(config.data, "validation").pairs[:16]
    hypotheses = Translator.from_workdir(str(tmp_path)).translate(
        [p["source"] for p in pairs], beam_size=2)
    expected = score(hypotheses, [p["target"] for p in pairs])
    assert bleu_records[0]["eval_bleu"] == pytest.approx(expected["bleu"])
    assert bleu_records[0]["eval_chrf"] == pytest.approx(expected["chrf"])


def test_a_run_with_gradient_clipping_restores(tmp_path):
    """The restored optimizer state has the trained run's structure (clipping adds a stage)."""
    train(tiny_run(num_train_steps=1, **{"optim.grad_clip_norm": 1.0}), str(tmp_path / "run"))
    (tmp_path / "run").rename(tmp_path / "moved")  # the workdir's tokenizer is found anyway
    translator = Translator.from_workdir(str(tmp_path / "moved"))
    assert translator.steps == [1] and len(translator.translate(SENTENCES, beam_size=1)) == 3
