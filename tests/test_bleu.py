"""score: cased sacreBLEU and chrF."""

import math

import pytest

from transformer_jax.bleu import score


def test_score_is_cased_sacrebleu():
    same = score(["Three hundred and two"], ["Three hundred and two"])
    assert same["bleu"] == pytest.approx(100.0) and same["chrf"] == pytest.approx(100.0)
    assert score(["three hundred and two"], ["Three hundred and two"])["bleu"] < 100.0
    assert "case:mixed" in same["signature"]


def test_bleu_by_hand_hypothesis_against_reference():
    """A 4-word hypothesis, every n-gram of it in the 6-word reference: precisions 1, and
    the brevity penalty exp(1 - 6/4), so BLEU = 100·e^-0.5 = 60.65 (the arguments swapped
    would give 100·(4/6·3/5·2/4·1/3)^(1/4) = 50.81). Words by sacreBLEU's 13a tokenizer."""
    scored = score(["the cat sat on"], ["the cat sat on the mat"])
    assert scored["bleu"] == pytest.approx(100 * math.exp(-0.5), rel=1e-9)
    assert "tok:13a" in scored["signature"]
