"""Scores of detokenized translations against references: cased sacreBLEU and chrF."""

import sacrebleu


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Cased sacreBLEU and chrF of detokenized text, with their signatures (what a reader
    needs to compare a score with another paper's)."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature())}
