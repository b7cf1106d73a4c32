"""Scores a trained run on a split with cased sacreBLEU and chrF.

    python evaluate.py --workdir=runs/default [--split=test] [--checkpoint=average:N]
                       [--dataset=folder:PATH]

Reads the split from the run's dataset (its config.data.dataset), or from --dataset in the
run's languages: the corpus moved since, or another test set (a folder holding
<split>.<source_lang> and <split>.<target_lang>, or tfds:NAME).
Writes DIR/eval/<split>-<name>.hyp.txt (the translations), <split>-<name>.ref.txt (the
references they were scored against, line by line: `sacrebleu X.ref.txt -i X.hyp.txt`
scores them again) and <split>-<name>.json (bleu, chrf, their sacreBLEU signatures, the
checkpoints, the dataset read, the search settings and batch size, pairs skipped and
sentences/s, compilation included).
<name> is the step, or "<last step>-average<N>" for N averaged checkpoints, then
"-beam<K>", "-alpha<A>", "-extra<E>" for search settings other than the run config's, and
"-on-<dataset>" for a --dataset not the run's (`dataset_label`: a folder's name and 6 hex
digits of its path's SHA-256, a TFDS name with _ for /).
Pairs with an empty side are not scored; their count is printed. The scores are printed
first, the files' names last; the files are written whole or not at all (a full disk: one
error line, exit status 1, and earlier results of the same name as they were).
"""

import signal

# Ctrl-C while the modules import ends the command at once and quietly, as it would a C
# program; from main on (where JAX loads, a second or more), interrupt_in_one_line says so
# in one line.
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import hashlib
import json
import os
import sys
import time
from typing import TYPE_CHECKING

import ml_collections
from absl import app, flags, logging

# What the flags need, and no JAX: a bad flag is said at once; the model loads in main.
from transformer_jax import command_line
from transformer_jax.bleu import score
from transformer_jax.command_line import define_search_flags, define_setting_flag, parse_flags
from transformer_jax.commands import (OutputError, interrupt_in_one_line, refuse_arguments,
                                      write_stdout_and_go_on, write_whole)
from transformer_jax.config_checks import ConfigError
from transformer_jax.data.sources import (DataError, absolute_dataset, dataset_kind, load_split,
                                          same_dataset)
from transformer_jax.output_paths import OutputPathError, writable_folder

if TYPE_CHECKING:
    from transformer_jax.translation import Translator

_WORKDIR = flags.DEFINE_string("workdir", None, "a training run's directory", required=True)
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "validation", "test"], "the split")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "latest",
                                  "latest, a step, or average:N (the last N averaged, §6.1)")
_AVERAGE = flags.DEFINE_integer("average_last", None, "deprecated: --checkpoint=average:N",
                                lower_bound=1)
_BEAM, _ALPHA, _EXTRA = define_search_flags()
_BATCH = define_setting_flag("batch_size", 32, "sentences per search (more: faster, if they "
                                               "fit in memory)")
_DATASET = flags.DEFINE_string(
    "dataset", None, "read the split from this dataset, in the run's languages, instead of the "
    "run's config.data.dataset: folder:PATH (the corpus moved, or another test set) or "
    "tfds:NAME")
flags.adopt_module_key_flags(command_line)  # so that --helpshort lists them


def checkpoint_spec() -> str:
    """--checkpoint, or the deprecated --average_last=N as average:N."""
    if _AVERAGE.value is None:
        return _CHECKPOINT.value
    if _CHECKPOINT.present:
        raise ConfigError("give --checkpoint or the deprecated --average_last, not both")
    print(f"warning: --average_last is deprecated; use --checkpoint=average:{_AVERAGE.value}",
          file=sys.stderr)
    return f"average:{_AVERAGE.value}"


def evaluate(translator: "Translator", pairs: list[dict], batch_size: int = 32, **search) -> dict:
    """Translates the sources of `pairs` and scores them against their targets (BLEU and
    chrF, §6.1). A source longer than a learned position table is a TranslationError."""
    start = time.perf_counter()
    hypotheses = translator.translate([p["source"] for p in pairs], progress=True,
                                      batch_size=batch_size, **search)
    seconds = time.perf_counter() - start
    return dict(score(hypotheses, [p["target"] for p in pairs]), hypotheses=hypotheses,
                sentences_per_sec=len(pairs) / seconds)


def results_name(translator: "Translator", settings: dict, dataset: str | None = None) -> str:
    """"500", "500-average5", "500-beam1", "500-on-newstest2015-3fa2c1": the step, the checkpoints
    averaged, the search settings that are not the run config's, and the `dataset` read when
    it is not the run's (their results would replace those)."""
    steps = translator.steps
    name = f"{steps[-1]}" if len(steps) == 1 else f"{steps[-1]}-average{len(steps)}"
    config = translator.search_settings()
    for key, short in (("beam_size", "beam"), ("alpha", "alpha"), ("max_extra_length", "extra")):
        if settings[key] != config[key]:
            name += f"-{short}{settings[key]}"  # Python's shortest exact text of it
    if dataset is not None and not same_dataset(dataset, translator.run_config.data.dataset):
        name += f"-on-{dataset_label(dataset)}"
    return name


def dataset_label(dataset: str) -> str:
    """"newstest2015-3fa2c1" for folder:/data/newstest2015 (its name, and the first hex
    digits of its path's SHA-256: two folders of one name are told apart),
    "wmt15_translate_de-en" for tfds:wmt15_translate/de-en, "numbers"."""
    kind, arg = dataset_kind(dataset)
    if kind != "folder":
        return (arg or kind).replace("/", "_")
    path = os.path.realpath(os.path.expanduser(arg))
    return f"{os.path.basename(path) or 'root'}-{hashlib.sha256(path.encode()).hexdigest()[:6]}"


def given_dataset() -> str | None:
    """--dataset as a run records one (a folder's path absolute), or None; a DataError for
    one of no known form, or a folder that is not there, before the model loads."""
    if _DATASET.value is None:
        return None
    try:
        dataset = absolute_dataset(_DATASET.value)
    except DataError as error:
        raise DataError(f"--dataset: {error}") from None
    kind, folder = dataset_kind(dataset)
    if kind == "folder" and not os.path.isdir(folder):
        raise DataError(f"--dataset: no folder {folder}")
    return dataset


def main(argv) -> None:
    """Loads the checkpoints and the split, translates, prints the scores, saves the files."""
    refuse_arguments(argv, "--workdir=runs/default --split=test")
    from transformer_jax.compilation_cache import use_compilation_cache
    from transformer_jax.trained_params import checkpoints_named
    from transformer_jax.translation import TranslationError, Translator

    logging.set_verbosity(logging.WARNING)
    use_compilation_cache(_WORKDIR.value)  # the searches of earlier commands, loaded
    try:
        dataset = given_dataset()
        translator = Translator.from_workdir(_WORKDIR.value, checkpoint_spec())
        split = run_split(translator.run_config.data, _SPLIT.value, dataset)
        if not split.pairs:
            raise DataError(f"the {_SPLIT.value} split has no pairs with text on both sides "
                            f"({split.skipped_empty} with an empty side)")
        out = writable_folder(os.path.join(_WORKDIR.value, "eval"), "the results folder")
        settings = translator.search_settings(beam_size=_BEAM.value, alpha=_ALPHA.value,
                                              max_extra_length=_EXTRA.value)
        result = evaluate(translator, split.pairs, batch_size=_BATCH.value, **settings)
    except (TranslationError, DataError, ConfigError, OutputPathError) as error:
        sys.exit(f"error: {error}")
    d = translator.run_config.data
    record = {"dataset": dataset or d.dataset, "split": _SPLIT.value,
              "step": translator.steps[-1],
              "checkpoints": translator.steps, "direction": f"{d.source_lang}-{d.target_lang}",
              "sentences": len(split.pairs), "skipped_empty": split.skipped_empty,
              **{k: v for k, v in result.items() if k != "hypotheses"}, **settings,
              "batch_size": _BATCH.value}
    skipped = (f"; {split.skipped_empty} with an empty side skipped" if split.skipped_empty
               else "")
    of = f" of {dataset}" if dataset else ""
    write_stdout_and_go_on(
        f"{record['direction']} {_SPLIT.value}{of} ({len(split.pairs)} sentences{skipped}, "
        f"{checkpoints_named(translator.steps)}): BLEU {record['bleu']:.2f}, "
        f"chrF {record['chrf']:.2f}\nsacreBLEU signatures: BLEU {record['signature']}, "
        f"chrF {record['chrf_signature']}\n")
    stem = os.path.join(out, f"{_SPLIT.value}-{results_name(translator, settings, dataset)}")
    save(stem, result["hypotheses"], [p["target"] for p in split.pairs], record)
    write_stdout_and_go_on(f"wrote {stem}.hyp.txt, .ref.txt and .json\n")


def run_split(data_config, split: str, dataset: str | None = None):
    """The run's `split`, or that of `dataset` (`given_dataset`) in the run's languages; the
    run's corpus folder gone is said in this command's terms."""
    if dataset is not None:
        data_config = ml_collections.ConfigDict(data_config)  # a copy: the run's stays
        data_config.dataset = dataset
        return load_split(data_config, split)
    kind, folder = dataset_kind(data_config.dataset)
    if kind == "folder" and not os.path.isdir(os.path.expanduser(folder)):
        where = ("" if os.path.isabs(os.path.expanduser(folder)) else
                 f" (relative to the folder train.py ran in, not to {os.getcwd()})")
        raise DataError(f"the run's corpus folder {folder!r}{where} does not exist; "
                        f"evaluate.py reads the {split} split there (the run's "
                        f"config.data.dataset): put the corpus there again or a link to it, "
                        f"or give its new place as --dataset=folder:PATH")
    return load_split(data_config, split)


def save(stem: str, hypotheses: list[str], references: list[str], record: dict) -> None:
    """STEM.hyp.txt, STEM.ref.txt and STEM.json, all whole or none; a write error is one
    line."""
    try:
        write_whole({f"{stem}.hyp.txt": "".join(h + "\n" for h in hypotheses),
                     f"{stem}.ref.txt": "".join(r + "\n" for r in references),
                     f"{stem}.json": json.dumps(record, indent=2)})
    except OutputError as error:
        sys.exit(f"error: cannot write {error.filename}: {error.strerror}")


if __name__ == "__main__":
    with interrupt_in_one_line():
        app.run(main, flags_parser=parse_flags)
