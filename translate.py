"""Translates sentences with a trained run: `python translate.py --workdir=runs/default`.

Reads one sentence per line from --input (or stdin; UTF-8, lines end at "\\n" only) and
writes the translations, one line each, in order, to --output (whole or not at all: a
temporary file renamed once written) or stdout. Beam search as in §6.1 by default. Ctrl-C
ends it with one line and status 130.

When stdin is a terminal (no --input), each line is translated as it is entered, until
Ctrl-D; a line it cannot translate (not UTF-8, too long) is one error line, and the next
is read.

--engine=jax (the default) translates with the run's checkpoints; --engine=ctranslate2 or
stablehlo with a directory that `python -m transformer_jax.export` wrote (--exported=DIR).
"""

import signal

# Ctrl-C while the modules import ends the command at once and quietly, as it would a C
# program; from main on (where JAX loads, a second or more), interrupt_in_one_line says so
# in one line.
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import functools
import os
import sys

from absl import app, flags, logging

# What the flags need, and no JAX: a bad flag is said at once; the engines load in main.
from transformer_jax import command_line
from transformer_jax.command_line import define_search_flags, define_setting_flag, parse_flags
from transformer_jax.commands import (OutputError, interrupt_in_one_line, refuse_arguments,
                                      write_stdout, write_whole)
from transformer_jax.config_checks import ConfigError
from transformer_jax.data import DataError
from transformer_jax.data.sources import decode_lines, read_lines
from transformer_jax.output_paths import OutputPathError, writable_file

_ENGINE = flags.DEFINE_enum("engine", "jax", ["jax", "ctranslate2", "stablehlo"],
                            "jax: a training run (--workdir); ctranslate2, stablehlo: an "
                            "export of one (--exported)")
_WORKDIR = flags.DEFINE_string("workdir", None, "a training run's directory (--engine=jax)")
_EXPORTED = flags.DEFINE_string("exported", None, "a directory python -m "
                                "transformer_jax.export wrote (--engine=ctranslate2|stablehlo)")
_INPUT = flags.DEFINE_string("input", None, "a UTF-8 file, one sentence per line (default stdin)")
_OUTPUT = flags.DEFINE_string("output", None, "where translations go (default stdout); "
                                "its folders are made")
_BEAM, _ALPHA, _EXTRA = define_search_flags()
_CHECKPOINT = flags.DEFINE_string("checkpoint", "latest", "latest, a step, or average:N "
                                  "(--engine=jax; an export holds the parameters it was made "
                                  "with)")
_BATCH = define_setting_flag("batch_size", 32, "sentences per search")
_MAX_INPUT = define_setting_flag(
    "max_input_length", None, "the most tokens a sentence may have, EOS included (default: "
    "the model's max_length); a longer one stops the run before any search (a line typed "
    "at a terminal: that line is refused, and the next one read)")
flags.adopt_module_key_flags(command_line)  # so that --helpshort lists them


def main(argv) -> None:
    refuse_arguments(argv, "--workdir=runs/default --input=FILE --output=FILE")
    for flag, otherwise in ((_INPUT, "stdin"), (_OUTPUT, "stdout")):
        if flag.value == "":  # it was read as no flag: a script's output went to stdout
            sys.exit(f"error: --{flag.name} is empty (an unset shell variable?); name a file, "
                     f"or leave the flag out for {otherwise}")
    try:  # the files first, before JAX loads (a second or more): their errors come at once
        if _OUTPUT.value:  # before any work whose results would go there
            writable_file(_OUTPUT.value, "--output")
        lines = read_lines(_INPUT.value) if _INPUT.value else None
    except (DataError, OutputPathError, OSError) as error:
        sys.exit(f"error: {error}")
    from transformer_jax.compilation_cache import use_compilation_cache
    from transformer_jax.export.engines import open_engine
    from transformer_jax.translation import TranslationError

    logging.set_verbosity(logging.WARNING)
    if _ENGINE.value == "jax" and _WORKDIR.value:
        use_compilation_cache(_WORKDIR.value)  # the searches of earlier commands, loaded
    try:
        engine = open_engine(_ENGINE.value, workdir=_WORKDIR.value, exported=_EXPORTED.value,
                             checkpoint=_CHECKPOINT.value)
        # stdin after the engine: a run's error is not held back by a pipe still writing
        typed = lines is None and sys.stdin is not None and sys.stdin.isatty()
        lines = [] if typed else lines if lines is not None else _read_stdin()
    except (TranslationError, DataError, ConfigError, OutputPathError, OSError) as error:
        sys.exit(f"error: {error}")
    print(engine.source, file=sys.stderr)  # stdout: translations
    translate = functools.partial(
        engine.translate, beam_size=_BEAM.value, alpha=_ALPHA.value,
        max_extra_length=_EXTRA.value, batch_size=_BATCH.value,
        max_input_length=_MAX_INPUT.value or engine.max_length)
    if typed:
        return translate_as_typed(translate)
    try:
        translations = translate(lines, progress=_INPUT.value is not None)
    except TranslationError as error:
        sys.exit(f"error: {error}")
    write_translations("".join(t + "\n" for t in translations))


def translate_as_typed(translate) -> None:
    """stdin is a terminal: each line translated once it is entered and shown on stdout
    (with --output, also written there whole at the end), until Ctrl-D. A line that cannot
    be translated (not UTF-8, too long) is one error line and the next is read; any other
    error (a search setting an export does not hold) ends the command, as from a pipe."""
    from transformer_jax.translation import SentenceTooLongError, TranslationError

    print("translating each line as it is entered; Ctrl-D ends", file=sys.stderr)
    translations, number = [], 1
    while typed := _read_typed():
        try:  # a chunk is one line in a terminal's line mode; Ctrl-D after text ends it too
            sentences = decode_lines(typed, "stdin", first_line=number) or [""]  # a lone BOM
            done = [t + "\n" for t in translate(sentences, progress=False)]
        except DataError as error:  # it names stdin and the line
            print(f"error: {error}", file=sys.stderr)
        except SentenceTooLongError as error:
            print(f"error: stdin, line {number}: {error}", file=sys.stderr)
        except TranslationError as error:
            sys.exit(f"error: {error}")
        else:
            write_stdout_or_exit("".join(done))
            translations += done
        number += max(typed.count(b"\n") + (not typed.endswith(b"\n")), 1)
    if _OUTPUT.value:
        write_translations("".join(translations))


def _read_stdin() -> list[str]:
    """stdin's lines; a read error (EIO from a terminal that went away) names stdin."""
    if sys.stdin is None:  # started with stdin closed (<&-)
        raise OSError("cannot read stdin: it is closed; give --input=FILE")
    try:
        data = sys.stdin.buffer.read()
    except OSError as error:
        raise OSError(f"cannot read stdin: {error.strerror or error}") from None
    return decode_lines(data, "stdin")


def _read_typed() -> bytes:
    """What the terminal gives one read: a line, or what was typed before Ctrl-D (b"" at
    the end). Not readline(), which would wait past a Ctrl-D after text for more. A read
    error ends the command in one line."""
    try:
        return os.read(sys.stdin.fileno(), 1 << 16)
    except OSError as error:
        sys.exit(f"error: cannot read stdin: {error.strerror or error}")


def write_translations(text: str) -> None:
    """`text` to --output, whole or not at all, or to stdout. A write error is one line and
    exit status 1; a reader of stdout that went away (`| head`) only exit status 1."""
    if not _OUTPUT.value:
        return write_stdout_or_exit(text)
    try:
        write_whole({_OUTPUT.value: text})
    except OutputError as error:
        sys.exit(f"error: cannot write {error.filename}: {error.strerror}")


def write_stdout_or_exit(text: str) -> None:
    """`text` to stdout; a reader that went away ends the command with exit status 1, any
    other write error with one line too."""
    try:
        write_stdout(text)
    except BrokenPipeError:
        sys.exit(1)
    except OSError as error:
        sys.exit(f"error: cannot write stdout: {error.strerror or error}")


if __name__ == "__main__":
    with interrupt_in_one_line():
        app.run(main, flags_parser=parse_flags)
