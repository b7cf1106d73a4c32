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


def test_chrf_by_hand_recall_weighted_over_characters():
    """chrF2 of "abcdef" against "abcdefg": every character n-gram of the hypothesis (n = 1
    to 6) is in the reference, so precision is 1 and recall (7 - n)/(8 - n) at order n;
    sacreBLEU averages each over the orders, then chrF = 5PR / (4P + R) (β = 2: recall
    counts four times as much). The arguments swapped would give recall 1, another score;
    chrF++ (word n-grams too) would miss the unmatched word."""
    recall = sum((7 - n) / (8 - n) for n in range(1, 7)) / 6
    scored = score(["abcdef"], ["abcdefg"])
    assert scored["chrf"] == pytest.approx(100 * 5 * recall / (4 + recall), rel=1e-9)
    assert "nc:6" in scored["chrf_signature"] and "nw:0" in scored["chrf_signature"]


def test_bleu_smooths_a_zero_count_as_sacrebleu_does_by_default():
    """"a b c d" against "a b c e": precisions 3/4, 2/3, 1/2 and no 4-gram of 1; sacreBLEU's
    default "exp" smoothing counts the first zero as 1/2 of a match, so BLEU =
    100·(3/4·2/3·1/2·1/2)^(1/4) = 59.46 (no brevity penalty); "floor" would give 39.76, and
    no smoothing 0. A corpus without 3-grams scores 0, as corpus BLEU does: not 100, which
    sentence BLEU's effective order (the orders there are) would give."""
    scored = score(["a b c d"], ["a b c e"])
    assert scored["bleu"] == pytest.approx(100 * (3 / 4 * 2 / 3 * 1 / 2 * 1 / 2) ** 0.25,
                                           rel=1e-9)
    assert "smooth:exp" in scored["signature"] and "eff:no" in scored["signature"]
    assert score(["three hundred"], ["three hundred"])["bleu"] == 0.0
