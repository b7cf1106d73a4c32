"""`python -m transformer_jax.data`: what the model sees, and errors without tracebacks."""

import os
import pathlib
import re
import signal
import subprocess
import sys

from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.token_ids import EOS_ID

ROOT = pathlib.Path(__file__).resolve().parents[1]
GERMAN = ["eins", "zwei", "", "einundzwanzig", "dreihundertzweiundvierzig", "tausend"]
ENGLISH = ["one", "two", "three", "twenty-one", "three hundred and forty-two", "one thousand"]


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "transformer_jax.data", "--config=configs/default.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300)


def write_corpus(folder, de_lines, en_lines):
    for split in ("train", "validation"):
        (folder / f"{split}.de").write_text("".join(line + "\n" for line in de_lines))
        (folder / f"{split}.en").write_text("".join(line + "\n" for line in en_lines))


def test_shows_examples_ids_and_statistics(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus, GERMAN * 30, ENGLISH * 30)
    result = run_cli(f"--config.data.dataset=folder:{corpus}", "--config.data.vocab_size=300",
                     "--config.data.max_source_length=6", "--split=validation", "--show=2",
                     f"--workdir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    tokenizer = Tokenizer.load(tmp_path / "run" / "tokenizer.model")  # trained and saved there
    assert f"ids     {tokenizer.encode('eins') + [EOS_ID]}" in out
    assert f"ids     {tokenizer.encode('two') + [EOS_ID]}" in out
    assert "example 3" not in out
    # 180 lines, 30 with an empty German side; sources over 6 tokens are counted.
    assert "150 pairs; 30 skipped (an empty side)" in out
    long_sources = sum(len(tokenizer.encode(s, add_eos=True)) > 6 for s in GERMAN if s) * 30
    assert re.search(rf"max_target_length=32: {long_sources} \(", out)
    # --max_pairs scans the split's first pairs, and the statistics say so.
    result = run_cli(f"--config.data.dataset=folder:{corpus}", "--config.data.vocab_size=300",
                     "--config.data.max_source_length=6", "--split=validation", "--show=0",
                     "--max_pairs=7", f"--workdir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr
    # The 30 skipped are the split's: they are not among the 7 scanned.
    assert ("150 pairs; 30 skipped (an empty side); statistics of the first 7 (--max_pairs)"
            in result.stdout)
    first_7 = ([s for s in GERMAN if s] * 2)[:7]  # the validation split repeats them
    long_sources = sum(len(tokenizer.encode(s, add_eos=True)) > 6 for s in first_7)
    assert re.search(rf"max_target_length=32: {long_sources} \(", result.stdout)


def test_show_0_shows_no_example_and_drop_is_said(tmp_path):
    """--show=0 goes straight to the statistics; with too_long="drop" they say that the
    pairs longer than a row are dropped, not cut."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus, GERMAN * 30, ENGLISH * 30)
    result = run_cli(f"--config.data.dataset=folder:{corpus}", "--config.data.vocab_size=300",
                     "--config.data.max_source_length=6", "--config.data.too_long=drop",
                     "--split=train", "--show=0")
    assert result.returncode == 0, result.stderr
    assert not re.search(r"^(example \d|  ids )", result.stdout, re.M)
    assert re.search(r"max_target_length=32: \d+ \([\d.]+%\), dropped in training$",
                     result.stdout.strip())


def test_bad_corpus_is_one_clear_line(tmp_path):
    write_corpus(tmp_path, GERMAN, ENGLISH[:-1])
    result = run_cli(f"--config.data.dataset=folder:{tmp_path}", "--split=train")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "train.de has 6 lines but" in result.stderr and "train.en has 5" in result.stderr


def test_a_corpus_that_is_not_there_is_one_line_and_makes_no_workdir(tmp_path):
    """prepare into a new workdir from a folder that is not there, or that lacks a split's
    files: one line, and no workdir is made (it held an empty train.lock)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.de").write_text("eins\n")
    (corpus / "train.en").write_text("one\n")
    gone = tmp_path / "gone"
    for folder, says in ((gone, f"dataset folder '{gone}' does not exist; set "),
                         (corpus, f"missing {corpus}/validation.de, {corpus}/validation.en; "
                                  f"{corpus} holds: train.de, train.en")):
        result = run_cli("prepare", f"--workdir={tmp_path / 'run'}",
                         f"--config.data.dataset=folder:{folder}")
        assert result.returncode == 1 and result.stderr.startswith(f"error: {says}"), result
        assert not (tmp_path / "run").exists()
    # Showing a split checks the files of the two it reads before the tokenizer trains on
    # the train split (it trained, then named the missing validation files).
    result = run_cli(f"--config.data.dataset=folder:{corpus}", "--show=0")
    assert result.returncode == 1, result
    assert result.stderr == (f"error: missing {corpus}/validation.de, {corpus}/validation.en; "
                             f"{corpus} holds: train.de, train.en (empty validation files "
                             f"train a run without evaluation)\n")


def test_unknown_config_key_is_rejected():
    result = run_cli("--config.data.vocab=300")
    assert result.returncode != 0 and "vocab" in result.stderr


def test_a_bad_config_value_is_train_pys_one_line_before_anything_is_read(tmp_path):
    """`prepare` and the show mode run train.py's config checks first: a bad value is named
    at once (not a traceback from the dataset, not after reading every training pair), and
    no workdir is made."""
    for command in (["prepare", f"--workdir={tmp_path / 'run'}"], []):
        result = run_cli(*command, "--config.data.numbers_size=tiny")
        assert result.returncode == 1
        assert result.stderr.strip() == ("error: config.data.numbers_size must be one of "
                                         "'full', 'small', got 'tiny'")
    assert not (tmp_path / "run").exists()


def test_a_misused_command_line_is_one_line(tmp_path):
    """A misspelt command, prepare without --workdir, no --config, and a --workdir that is a
    file or cannot be made: one line each (absl's usage errors printed the whole help)."""
    (tmp_path / "a_file").write_text("")
    cases = [(["preapre"], "error: unknown command 'preapre': use prepare, or show "
              "(the same as no command)"),
             (["prepare"], "error: prepare needs --workdir: the run's directory, where the "
                           "tokenizer and the prepared ids are kept"),
             ([f"--workdir={tmp_path / 'a_file'}"],
              f"error: --workdir {tmp_path / 'a_file'} is a file, not a folder"),
             (["--workdir="], "error: --workdir is empty (an unset shell variable?); name a "
                              "folder"),
             ([f"--workdir={tmp_path / 'a_file' / 'run'}"],
              f"error: --workdir {tmp_path / 'a_file' / 'run'} is not a writable folder: Not a "
              f"directory"),
             (["prepare", f"--workdir={tmp_path / 'run'}", "--split=test", "--show=3"],
              "error: --split, --show are for showing a split (no command), not for prepare, "
              "which prepares train and validation"),  # were ignored
             (["--config.data.datset=folder:corpus"],
              "error in the command line: --config.data.datset: config.data has no key "
              "'datset'; did you mean 'dataset'?"),
             (["--config.data.vocab_size=1e4"],
              "error in the command line: --config.data.vocab_size=1e4: config.data.vocab_size "
              "is an integer, got '1e4'"),  # absl's two lines: "invalid literal for int()"
             (["--config.data.tokenizer_type=wordpiece"],  # was found after reading the split
              "error: config.data.tokenizer_type must be one of 'bpe', 'unigram', got "
              "'wordpiece'"),
             ([f"--config.data.dataset=folder:{tmp_path / 'a_file'}"],
              f"error: dataset folder '{tmp_path / 'a_file'}' is a file, not a folder; set "
              f"--config.data.dataset=folder:PATH, the folder that holds train.de and "
              f"train.en")]  # the tokenizer is trained first, on train
    for args, message in cases:
        result = run_cli(*args)
        assert (result.returncode, result.stderr.strip()) == (1, message)
    result = subprocess.run([sys.executable, "-m", "transformer_jax.data"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stderr.strip()) == (
        1, "error: --config is required, e.g. --config=configs/default.py")


def test_prepare_names_a_damaged_file_and_prepares_or_stops(tmp_path):
    """A manifest cut short: a warning naming it, the split prepared again, exit 0. A
    tokenizer model cut short with no record to train it again by: one error line naming
    it, exit 1. Never a traceback."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus, GERMAN * 30, ENGLISH * 30)
    run = tmp_path / "run"
    flags = ["prepare", f"--config.data.dataset=folder:{corpus}", "--config.data.vocab_size=300",
             f"--workdir={run}"]
    first = run_cli(*flags)
    assert first.returncode == 0, first.stderr
    # 180 lines, 30 with an empty German side: said, not dropped silently.
    assert re.search(r"^prepared train: 150 pairs, .*; 30 skipped \(an empty side\)$",
                     first.stdout, re.M), first.stdout
    # Both sides of the 150 pairs train it; sentencepiece says nothing while it trains.
    assert re.search(r"^training the tokenizer: 300 bpe pieces from 300 sentences\n"
                     r"trained the tokenizer in \d+\.\d s$", first.stdout, re.M), first.stdout
    manifest = run / "prepared" / "validation" / "manifest.json"
    whole = manifest.read_text()
    manifest.write_text(whole[:len(whole) // 2])
    again = run_cli(*flags)
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert re.search(rf"^warning: {re.escape(str(manifest))} is damaged \(JSONDecodeError: "
                     r".*\); preparing validation again\n", again.stderr, re.M)
    assert manifest.read_text() == whole
    assert "prepared train:" not in again.stdout  # whole: reused, and the line says so
    assert "training the tokenizer" not in again.stdout
    assert "\ntrain: prepared before, checked and reused\n" in again.stdout, again.stdout
    (run / "tokenizer.model.json").unlink()
    model = run / "tokenizer.model"
    model.write_bytes(model.read_bytes()[:1000])
    stopped = run_cli(*flags)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {model} is damaged (not a "
                                                     "SentencePiece model: 1,000 bytes")


def test_ctrl_c_while_the_dataset_is_built_is_one_line_and_ends_its_workers(tmp_path):
    """Ctrl-C in a terminal (SIGINT to the whole process group) while the first run builds
    the numbers dataset on every core: "error: interrupted", death by SIGINT, and the pool's
    worker processes gone too. They printed tracebacks of their own, and once the calling
    process was gone they waited forever, holding its stderr open (communicate never
    returned)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "transformer_jax.data", "prepare", "--config=configs/default.py",
         f"--workdir={tmp_path / 'run'}"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
        env={**os.environ, "TFDS_DATA_DIR": str(tmp_path / "tfds")})
    seen = b""
    # TFDS's bar counts the examples the pool has spelled: no newline to wait for.
    while not re.search(rb"Generating train examples\.\.\.: [1-9]", seen):
        chunk = os.read(process.stderr.fileno(), 4096)
        assert chunk, seen.decode()
        seen += chunk
    os.killpg(process.pid, signal.SIGINT)
    stderr = seen.decode() + process.communicate(timeout=60)[1].decode()
    assert process.returncode == -signal.SIGINT, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted", stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr


def test_helpshort_names_the_config_default_or_that_it_is_required():
    """train.py runs configs/default.py without --config, and --help said "(default:
    'None')"; the data command needs one, and said "(required)" then "(default: 'None')"."""
    shown = {}
    for command in (["train.py"], ["-m", "transformer_jax.data"]):
        result = subprocess.run([sys.executable, *command, "--helpshort"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and not result.stderr, result.stderr  # absl's status
        shown[command[-1]] = re.search(r"^  --config: (.*?)\n  --", result.stdout,
                                       re.S | re.M).group(1)
    assert shown["train.py"] == "a config file (configs/*.py)\n    (default: 'configs/default.py')"
    assert "(required)" in shown["transformer_jax.data"]
    assert "default" not in shown["transformer_jax.data"].replace("configs/default.py", "")


def test_percentiles_are_lengths_some_sentence_has():
    """p50 of lengths 2 and 10 is 2 (half the sentences are no longer), p90 10: NumPy's
    default interpolated them to 6.0 and 9.2, which int() printed as 6 and 9, lengths no
    sentence had. The mean is the mean."""
    import numpy as np

    from transformer_jax.data.report import SplitStatistics, format_statistics

    stats = SplitStatistics(pairs=2, split_pairs=2, skipped_empty=0,
                            source_lengths=np.array([2, 10]), target_lengths=np.array([3, 3]),
                            max_source_length=8, max_target_length=8, too_long="truncate")
    lines = format_statistics(stats).splitlines()
    assert lines[2].split() == ["source", "2", "10", "10", "10", "6.00"]
    assert lines[3].split() == ["target", "3", "3", "3", "3", "3.00"]


def test_an_empty_split_has_counts_and_no_table_and_control_characters_are_shown_escaped():
    """A split with no pairs left (every pair had an empty side) says so without a table
    header over no rows; an example's tab and escape are written as \\t and \\x1b, so that
    the terminal does not act on them."""
    import numpy as np

    from transformer_jax.data.report import SplitStatistics, format_example, format_statistics

    empty = SplitStatistics(pairs=0, split_pairs=0, skipped_empty=3,
                            source_lengths=np.array([], int), target_lengths=np.array([], int),
                            max_source_length=8, max_target_length=8, too_long="truncate")
    assert format_statistics(empty) == "0 pairs; 3 skipped (an empty side)"

    class Pieces:  # a tokenizer of one piece per character
        def encode(self, text, add_eos):
            return [ord(c) for c in text] + [EOS_ID] * add_eos

        def id_to_piece(self, i):
            return chr(i) if i != EOS_ID else "</s>"

    shown = format_example(1, {"source": "a\tb\x1b[2J", "target": "ü"}, Pieces())
    assert shown.splitlines()[1:4] == ["  source  a\\tb\\x1b[2J",
                                       f"  ids     {[97, 9, 98, 27, 91, 50, 74, EOS_ID]}",
                                       "  pieces  a \\t b \\x1b [ 2 J </s>"]
    assert shown.splitlines()[4] == "  target  ü"


def test_statistics_of_the_first_pairs_are_per_pair_scanned_and_say_drop():
    """Of a split of 10 pairs, 2 scanned (--max_pairs): 18 tokens in them are 9 per pair
    (not 1.8 per pair of the split), 1 of the 2 is longer than a row (50 %), and with
    too_long="drop" the line says that it is dropped."""
    import numpy as np

    from transformer_jax.data.report import SplitStatistics, format_statistics

    stats = SplitStatistics(pairs=2, split_pairs=10, skipped_empty=0,
                            source_lengths=np.array([2, 10]), target_lengths=np.array([3, 3]),
                            max_source_length=8, max_target_length=8, too_long="drop")
    lines = format_statistics(stats).splitlines()
    assert lines[0] == ("10 pairs; 0 skipped (an empty side); statistics of the first 2 "
                        "(--max_pairs)")
    assert lines[-2:] == ["  tokens per pair (both sides): 9.00",
                          "  longer than max_source_length=8 or max_target_length=8: 1 (50.00%), "
                          "dropped in training"]
