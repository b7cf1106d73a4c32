"""Scores of detokenized translations against references: cased sacreBLEU and chrF."""

import sacrebleu


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Cased sacreBLEU and chrF of detokenized text, with the BLEU signature."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "signature": str(bleu.get_signature())}
