"""Scores a trained run on a split with cased sacreBLEU and chrF.

    python evaluate.py --workdir=runs/default [--split=test] [--checkpoint=average:N]

Writes DIR/eval/<split>-<name>.hyp.txt and DIR/eval/<split>-<name>.json (bleu, chrf,
the sacreBLEU signature, the checkpoints, the decoding settings and sentences/s);
<name> is the step, or "<last step>-average<N>" for N averaged checkpoints. The scores are
printed first; the two files are written whole or not at all (a full disk: one error line,
exit status 1, and earlier results of the same name as they were).
"""

import signal

# Ctrl-C while JAX is imported (a second or more) ends the command at once and quietly, as
# it would a C program; from main on, interrupt_in_one_line says so in one line.
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import json
import os
import sys
import time

from absl import app, flags, logging

from transformer_jax.bleu import score
from transformer_jax.config_checks import ConfigError, writable_folder
from transformer_jax.data import DataError, load_split
from transformer_jax import command_line
from transformer_jax.command_line import define_search_flags, parse_flags
from transformer_jax.compilation_cache import use_compilation_cache
from transformer_jax.commands import (OutputError, interrupt_in_one_line, write_stdout,
                                      write_whole)
from transformer_jax.translation import TranslationError, Translator

_WORKDIR = flags.DEFINE_string("workdir", None, "a training run's directory", required=True)
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "validation", "test"], "the split")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "latest",
                                  "latest, a step, or average:N (the last N averaged, §6.1)")
_AVERAGE = flags.DEFINE_integer("average_last", None, "deprecated: --checkpoint=average:N",
                                lower_bound=1)
_BEAM, _ALPHA, _EXTRA = define_search_flags()
flags.adopt_module_key_flags(command_line)  # so that --helpshort lists them


def checkpoint_spec() -> str:
    """--checkpoint, or the deprecated --average_last=N as average:N."""
    if _AVERAGE.value is None:
        return _CHECKPOINT.value
    if _CHECKPOINT.value != "latest":
        raise ConfigError("give --checkpoint or the deprecated --average_last, not both")
    print(f"warning: --average_last is deprecated; use --checkpoint=average:{_AVERAGE.value}",
          file=sys.stderr)
    return f"average:{_AVERAGE.value}"


def evaluate(translator: Translator, pairs: list[dict], **search) -> dict:
    """Translates the sources of `pairs` and scores them against their targets."""
    start = time.perf_counter()
    hypotheses = translator.translate([p["source"] for p in pairs], progress=True, **search)
    seconds = time.perf_counter() - start
    return dict(score(hypotheses, [p["target"] for p in pairs]), hypotheses=hypotheses,
                sentences_per_sec=len(pairs) / seconds)


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    use_compilation_cache(_WORKDIR.value)  # the searches of earlier commands, loaded
    try:
        translator = Translator.from_workdir(_WORKDIR.value, checkpoint_spec())
        out = writable_folder(os.path.join(_WORKDIR.value, "eval"), "the results folder")
        pairs = load_split(translator.run_config.data, _SPLIT.value).pairs
    except (TranslationError, DataError, ConfigError) as error:
        sys.exit(f"error: {error}")
    settings = translator.search_settings(beam_size=_BEAM.value, alpha=_ALPHA.value,
                                          max_extra_length=_EXTRA.value)
    result = evaluate(translator, pairs, **settings)
    steps = translator.steps
    name = f"{steps[-1]}" if len(steps) == 1 else f"{steps[-1]}-average{len(steps)}"
    d = translator.run_config.data
    record = {"split": _SPLIT.value, "step": steps[-1], "checkpoints": steps,
              "direction": f"{d.source_lang}-{d.target_lang}", "sentences": len(pairs),
              **{k: v for k, v in result.items() if k != "hypotheses"}, **settings}
    which = (f"step {steps[0]}" if len(steps) == 1
             else f"steps {', '.join(map(str, steps))} averaged")
    report(f"{record['direction']} {_SPLIT.value} ({len(pairs)} sentences, {which}): "
           f"BLEU {record['bleu']:.2f}, chrF {record['chrf']:.2f}\n"
           f"sacreBLEU signature: {record['signature']}\n")
    save(os.path.join(out, f"{_SPLIT.value}-{name}"), result["hypotheses"], record)


def save(stem: str, hypotheses: list[str], record: dict) -> None:
    """STEM.hyp.txt and STEM.json, both whole or neither; a write error is one line."""
    try:
        write_whole({f"{stem}.hyp.txt": "".join(h + "\n" for h in hypotheses),
                     f"{stem}.json": json.dumps(record, indent=2)})
    except OutputError as error:
        sys.exit(f"error: cannot write {error.filename}: {error.strerror}")


def report(scores: str) -> None:
    """Prints `scores` before the files are written, so that a full disk does not lose them; a
    reader of stdout that went away (`| head`) does not stop the files."""
    try:
        write_stdout(scores)
    except BrokenPipeError:
        pass
    except OSError as error:
        print(f"warning: cannot write the scores to stdout: {error.strerror or error}",
              file=sys.stderr)


if __name__ == "__main__":
    with interrupt_in_one_line():
        app.run(main, flags_parser=parse_flags)
