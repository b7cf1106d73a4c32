"""Scores a trained run on a split with cased sacreBLEU and chrF.

    python evaluate.py --workdir=runs/default [--split=test] [--average_last=N]

Writes DIR/eval/<split>-<step>.hyp.txt and DIR/eval/<split>-<step>.json (bleu, chrf,
the sacreBLEU signature, the step, the decoding settings and sentences/s).
"""

import json
import os
import sys

from absl import app, flags, logging

from transformer_jax.config_checks import ConfigError, writable_folder
from transformer_jax.data import DataError, load_split
from transformer_jax.run_config import parse_flags
from transformer_jax.translation import TranslationError, Translator, evaluate

_WORKDIR = flags.DEFINE_string("workdir", None, "a training run's directory", required=True)
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "validation", "test"], "the split")
_AVERAGE = flags.DEFINE_integer("average_last", 1, "average the last N checkpoints (§6.1)",
                                lower_bound=1)
_BEAM = flags.DEFINE_integer("beam_size", 4, "beam size; 1 is greedy search", lower_bound=1)
_ALPHA = flags.DEFINE_float("alpha", 0.6, "length penalty exponent (§6.1)", lower_bound=0.0)
_EXTRA = flags.DEFINE_integer("max_extra_length", 50, "output tokens beyond the input length",
                              lower_bound=0)


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    checkpoint = "latest" if _AVERAGE.value == 1 else f"average:{_AVERAGE.value}"
    try:
        translator = Translator.from_workdir(_WORKDIR.value, checkpoint)
        out = writable_folder(os.path.join(_WORKDIR.value, "eval"), "the results folder")
        pairs = load_split(translator.run_config.data, _SPLIT.value).pairs
    except (TranslationError, DataError, ConfigError) as error:
        sys.exit(f"error: {error}")
    settings = {"beam_size": _BEAM.value, "alpha": _ALPHA.value,
                "max_extra_length": _EXTRA.value}
    result = evaluate(translator, pairs, **settings)
    step = translator.steps[-1]
    d = translator.run_config.data
    record = {"split": _SPLIT.value, "step": step, "checkpoints": translator.steps,
              "direction": f"{d.source_lang}-{d.target_lang}", "sentences": len(pairs),
              **{k: v for k, v in result.items() if k != "hypotheses"}, **settings}
    with open(os.path.join(out, f"{_SPLIT.value}-{step}.hyp.txt"), "w", encoding="utf-8") as f:
        f.write("".join(h + "\n" for h in result["hypotheses"]))
    with open(os.path.join(out, f"{_SPLIT.value}-{step}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    print(f"{record['direction']} {_SPLIT.value} ({len(pairs)} sentences, step {step}): "
          f"BLEU {record['bleu']:.2f}, chrF {record['chrf']:.2f}\n"
          f"sacreBLEU signature: {record['signature']}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
