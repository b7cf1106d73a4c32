"""The data of a run: prepare it once, or show what the model sees.

    python -m transformer_jax.data prepare --config=configs/default.py --workdir=runs/default
    python -m transformer_jax.data --config=configs/default.py --split=validation --show=5

`prepare` trains (or loads) the run's tokenizer and writes the training and
validation splits as token ids into WORKDIR/prepared, with progress and rates;
`train.py` does the same on its first start, so this is for preparing ahead (e.g.
before a multi-host run).
Without a command, a split's examples are shown as text, ids and pieces, then
statistics.

--config is required; override any of its keys with --config.key=value, e.g. your own
corpus with --config=configs/local_text.py --config.data.dataset=folder:PATH.
Ctrl-C ends it in one line; a rerun of prepare keeps what was whole.
"""

import signal

# Ctrl-C while JAX is imported ends the command at once and quietly, as it would a C
# program; from main on, interrupt_in_one_line says so in one line (as translate.py).
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import os
import sys
import tempfile

from absl import app, flags, logging
from ml_collections import config_flags

from transformer_jax.config_checks import ConfigError, checked_copy
from transformer_jax.output_paths import OutputPathError, writable_folder
from transformer_jax.data import report
from transformer_jax.data.prepared import (PREPARED_SPLITS, check_corpus_files, made_workdir,
                                           prepare, prepared_dir)
from transformer_jax.data.sources import DataError, load_split
from transformer_jax.data.vocabulary import get_tokenizer, tokenizer_path
from transformer_jax.command_line import parse_flags
from transformer_jax.commands import interrupt_in_one_line
from transformer_jax.workdir_lock import workdir_lock

_CONFIG = config_flags.DEFINE_config_file("config", None, "a config file (required), e.g. "
                                          "configs/default.py; --config.key=value overrides "
                                          "a key", lock_config=True)
flags.FLAGS["config"].default_as_str = None  # --help says "(required)", not "(default: 'None')"
_SPLIT = flags.DEFINE_enum("split", "validation", ["train", "validation", "test"],
                           "the split to show")
_SHOW = flags.DEFINE_integer("show", 5, "how many examples to show", lower_bound=0)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "a run's directory: its tokenizer is used, or trained and saved there; "
    "without one a tokenizer is trained in a temporary directory")
_MAX_PAIRS = flags.DEFINE_integer("max_pairs", 100_000, "statistics of the first this many "
                                  "pairs of the split shown", lower_bound=1)
_SHOW_FLAGS = (_SPLIT, _SHOW, _MAX_PAIRS)  # for showing only: given to prepare, refused


def main(argv) -> None:
    logging.set_verbosity(logging.WARNING)  # TFDS reports every file at INFO
    command = argv[1:] or ["show"]
    if command not in (["show"], ["prepare"]):
        sys.exit(f"error: unknown command {' '.join(command)!r}: use prepare, or show "
                 "(the same as no command)")
    config = _CONFIG.value
    if config is None:
        sys.exit("error: --config is required, e.g. --config=configs/default.py")
    try:
        config = checked_copy(config)  # as train() checks and records it, before any reading
    except ConfigError as error:
        sys.exit(f"error: {error}")
    if command == ["prepare"]:
        return prepare_command(config)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            given = _WORKDIR.value is not None  # "" is refused, as an unset variable
            workdir = writable_folder(_WORKDIR.value) if given else scratch
            # The files of the two splits read, before the tokenizer trains on one of them.
            check_corpus_files(config.data, dict.fromkeys(("train", _SPLIT.value)))
            tokenizer = get_tokenizer(config.data, workdir,
                                      log=lambda line: print(line, file=sys.stderr))
            split = load_split(config.data, _SPLIT.value)
            d = config.data
            print(f"{d.dataset} ({d.source_lang} -> {d.target_lang}), split {split.name}: "
                  f"{len(split):,} pairs")
            where = tokenizer_path(workdir) if given else "(temporary)"
            print(report.format_tokenizer(tokenizer, where), end="\n\n")
            for number, pair in enumerate(split.pairs[: _SHOW.value], start=1):
                print(report.format_example(number, pair, tokenizer), end="\n\n")
            stats = report.split_statistics(split, tokenizer, config.data, _MAX_PAIRS.value)
            print(report.format_statistics(stats))
    except (DataError, ConfigError, OutputPathError) as error:
        sys.exit(f"error: {error}")


def prepare_command(config) -> None:
    """`prepare`: the tokenizer and the prepared splits of --workdir, made or reused."""
    if given := [f"--{flag.name}" for flag in _SHOW_FLAGS if flags.FLAGS[flag.name].present]:
        sys.exit(f"error: {', '.join(given)} {'is' if len(given) == 1 else 'are'} for showing "
                 f"a split (no command), not for prepare, which prepares "
                 f"{' and '.join(PREPARED_SPLITS)}")
    if not _WORKDIR.value:
        sys.exit("error: prepare needs --workdir: the run's directory, where the "
                 "tokenizer and the prepared ids are kept")
    made = []

    def log(line: str) -> None:
        made.append(line.split(":")[0].removeprefix("prepared "))
        print(line)

    try:
        with workdir_lock(made_workdir(config.data, _WORKDIR.value), "data preparation"):
            tokenizer, splits = prepare(config.data, _WORKDIR.value, log=log)
    except (DataError, ConfigError, OutputPathError) as error:
        sys.exit(f"error: {error}")
    if reused := [name for name in splits if name not in made]:
        print(f"{', '.join(reused)}: prepared before, checked and reused")
    sizes = ", ".join(f"{name} {len(split):,}" for name, split in splits.items())
    print(f"{prepared_dir(_WORKDIR.value)}: {sizes} pairs; vocabulary of "
          f"{tokenizer.vocab_size:,} pieces")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with interrupt_in_one_line():
        app.run(main, flags_parser=parse_flags)
