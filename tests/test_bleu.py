"""score: cased sacreBLEU and chrF."""

import pytest

from transformer_jax.bleu import score


def test_score_is_cased_sacrebleu():
    same = score(["Three hundred and two"], ["Three hundred and two"])
    assert same["bleu"] == pytest.approx(100.0) and same["chrf"] == pytest.approx(100.0)
    assert score(["three hundred and two"], ["Three hundred and two"])["bleu"] < 100.0
    assert "case:mixed" in same["signature"]
