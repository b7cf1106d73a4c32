"""Translates sentences with a trained run: `python translate.py --workdir=runs/default`.

Reads one sentence per line from --input (or stdin) and writes the translations, in
order, to --output (or stdout). Beam search as in §6.1 by default.
"""

import sys

from absl import app, flags, logging

from transformer_jax.run_config import parse_flags
from transformer_jax.translation import TranslationError, Translator

_WORKDIR = flags.DEFINE_string("workdir", None, "a training run's directory", required=True)
_INPUT = flags.DEFINE_string("input", None, "a UTF-8 file, one sentence per line (default stdin)")
_OUTPUT = flags.DEFINE_string("output", None, "where translations go (default stdout)")
_BEAM = flags.DEFINE_integer("beam_size", 4, "beam size; 1 is greedy search")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "length penalty exponent (§6.1)")
_EXTRA = flags.DEFINE_integer("max_extra_length", 50, "output tokens beyond the input length")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "latest", "latest, a step, or average:N")
_BATCH = flags.DEFINE_integer("batch_size", 32, "sentences per search")


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    try:
        translator = Translator.from_workdir(_WORKDIR.value, _CHECKPOINT.value)
        if _INPUT.value:
            with open(_INPUT.value, encoding="utf-8") as f:
                lines = f.read().splitlines()
        else:
            lines = sys.stdin.read().splitlines()
    except (TranslationError, OSError) as error:
        sys.exit(f"error: {error}")
    translations = translator.translate(
        lines, beam_size=_BEAM.value, alpha=_ALPHA.value, max_extra_length=_EXTRA.value,
        batch_size=_BATCH.value, progress=_INPUT.value is not None)
    text = "".join(t + "\n" for t in translations)
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
