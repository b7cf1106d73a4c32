"""`decode --peers`: our search beside CTranslate2's, on the same weights and sentences.

Each case is exported with `ctranslate2_model` (float32, and int8 weights) and translated
by three engines: ours (`predict.predict`, the path translate.py takes), CTranslate2
float32 and CTranslate2 int8, each on the machine's cores (ours: XLA's CPU thread pool;
CTranslate2: intra_threads = the core count). Batches of 32, searched as translate.py
searches them (sorted by length, outputs up to the padded input length + max_extra_length).

    numbers   a trained run's model (--workdir, default runs/default) on its test split's
              first 512 sentences; BLEU against the references
    base      Table 3's base model with random weights on 32 sentences of 30 random tokens;
              random weights rarely choose EOS, so every engine writes ~32 tokens a sentence

Tokens counted are each engine's own output tokens, EOS included.
"""

import os
import tempfile

import jax
import numpy as np

from transformer_jax.benchmark import report
from transformer_jax.bleu import score
from transformer_jax.predict import predict

BATCH = 32


def run(quick: bool = False, workdir: str = "runs/default") -> tuple[list[dict], list[str]]:
    """(rows, notes): each case of the module's docstring translated by the three engines."""
    import ctranslate2  # noqa: F401 -- the peer: a clear ImportError before any work

    rows, notes = [], []
    for case in _cases(quick, workdir, notes):
        rows += _time_case(**case, quick=quick)
    notes += ["ratio: tokens/s over CTranslate2 float32's, same case and search",
              "same: the fraction of sentences whose output ids equal ours",
              f"threads: {os.cpu_count()} for every engine"]
    return rows, notes


def _cases(quick: bool, workdir: str, notes: list[str]) -> list[dict]:
    from transformer_jax.benchmark.model import model_configs
    from transformer_jax.model import Transformer
    from transformer_jax.train_state import init_params

    name = "tiny" if quick else "base"
    model = Transformer(model_configs()[name])
    rng = np.random.default_rng(0)
    sources = [list(rng.integers(4, model.config.vocab_size, 29)) + [1]
               for _ in range(8 if quick else BATCH)]
    cases = [dict(case=f"{name}, random weights", model=model,
                  params=init_params(model, jax.random.key(0)), sources=sources,
                  references=None, pieces=None, extra=0)]
    if quick:
        return cases
    if not os.path.isdir(os.path.join(workdir, "checkpoints")):
        notes.append(f"numbers: skipped, {workdir} has no checkpoints (make train)")
        return cases
    return [_numbers_case(workdir)] + cases


def _numbers_case(workdir: str) -> dict:
    from transformer_jax.data import load_split
    from transformer_jax.translation import Translator

    translator = Translator.from_workdir(workdir)
    pairs = load_split(translator.run_config.data, "test").pairs[:512]
    tokenizer = translator.tokenizer
    return dict(case=f"numbers ({workdir}, step {translator.steps[-1]})",
                model=translator.model, params=translator.params,
                sources=tokenizer.encode_batch([p["source"] for p in pairs], add_eos=True),
                references=[p["target"] for p in pairs], tokenizer=tokenizer,
                pieces=[tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)],
                extra=50)


def _time_case(*, case, model, params, sources, references, pieces, extra, quick,
               tokenizer=None) -> list[dict]:
    """Rows of every search and engine for one case."""
    from transformer_jax.benchmark.timing import median_seconds
    from transformer_jax.export.ctranslate2_model import (CTranslate2Translator, save_model,
                                                          transformer_spec)

    pieces = pieces or ["<pad>", "</s>", "<s>", "<unk>"] + [
        f"p{i}" for i in range(4, model.config.vocab_size)]
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        engines = {"ours (jax float32)": None}
        for quantization in ("float32", "int8"):
            path = os.path.join(directory, quantization)
            os.makedirs(path)
            save_model(transformer_spec(model.config, params, pieces), path, quantization)
            engines[f"ctranslate2 {quantization}"] = CTranslate2Translator(
                _ct2(path), pieces, {})
        for beam_size in (1, 4):
            settings = dict(beam_size=beam_size, alpha=0.6, max_extra_length=extra,
                            batch_size=BATCH)
            outputs = {}
            for engine, translator in engines.items():
                def translate(translator=translator):
                    if translator is None:
                        return [_until_eos(o) for o in predict(model, params, sources,
                                                              **settings)]
                    return translator.translate_ids(sources, **settings)

                seconds = median_seconds(translate, warmup=1, iters=2 if quick else 3)
                outputs[engine] = translate()
                rows.append(report.measured(_row(case, beam_size, engine, seconds, outputs,
                                                 references, tokenizer)))
    return _with_ratios(rows)


def _ct2(path: str):
    import ctranslate2

    return ctranslate2.Translator(path, intra_threads=os.cpu_count())


def _until_eos(row) -> list[int]:
    row = [int(i) for i in row]
    return row[:row.index(1) + 1] if 1 in row else row


def _row(case, beam_size, engine, seconds, outputs, references, tokenizer) -> dict:
    mine, ours = outputs[engine], outputs["ours (jax float32)"]
    tokens = sum(map(len, mine))
    row = {"case": case, "search": "greedy" if beam_size == 1 else f"beam{beam_size}",
           "engine": engine, "sentences": len(mine), "tokens": tokens, "s": seconds,
           "tokens_per_sec": tokens / seconds, "sentences_per_sec": len(mine) / seconds,
           "same": sum(a == b for a, b in zip(mine, ours)) / len(mine)}
    if references is not None:
        row["bleu"] = score(tokenizer.decode_batch(mine), references)["bleu"]
    return row


def _with_ratios(rows: list[dict]) -> list[dict]:
    for row in rows:
        peer = next(r for r in rows if r["search"] == row["search"]
                    and r["engine"] == "ctranslate2 float32")
        row["ratio"] = row["tokens_per_sec"] / peer["tokens_per_sec"]
    return rows
