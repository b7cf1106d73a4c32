"""python -m transformer_jax.export --workdir=DIR --format=ctranslate2|stablehlo --output=OUT

    --checkpoint=latest|N|average:N     which parameters (§6.1 averages the last 5)
    --beam_size --alpha --max_extra_length   the search (default: the run's config.decode):
                                        stablehlo compiles it, ctranslate2 records it
    --quantization=int8|float16|...     ctranslate2: the weights' type (default float32)
    --batch_sizes=1,8,32 --lengths=...  stablehlo: the buckets compiled ahead

Then `translate.py --engine=ctranslate2|stablehlo --exported=OUT` translates with it.
A flag of the other format is refused, not ignored. Ctrl-C ends it in one line and leaves
no half-written --output.
"""

import signal

# Ctrl-C while the modules import ends the command at once and quietly, as it would a C
# program; from main on (where JAX loads), interrupt_in_one_line says so in one line (as
# translate.py).
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import sys

from absl import app, flags, logging

from transformer_jax import command_line
from transformer_jax.command_line import define_search_flags, one_line_warnings
from transformer_jax.commands import interrupt_in_one_line, refuse_arguments
from transformer_jax.data import DataError
from transformer_jax.export import FORMATS, MAX_POSITIONS, QUANTIZATIONS, ExportError, export

_WORKDIR = flags.DEFINE_string("workdir", None, "a training run's directory", required=True)
_FORMAT = flags.DEFINE_enum("format", None, FORMATS, "what to export to", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "the directory to write", required=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", "latest", "latest, a step, or average:N")
_FORCE = flags.DEFINE_bool("force", False, "replace --output if it is an earlier export "
                           "(a folder with export.json); never another folder")
_QUANTIZATION = flags.DEFINE_enum("quantization", None, QUANTIZATIONS,
                                  "ctranslate2: the weights' type (default: float32)")
_MAX_POSITIONS = flags.DEFINE_integer("max_positions", MAX_POSITIONS, "ctranslate2: rows "
                                      "of the position table, the longest input or output",
                                      lower_bound=1)
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "stablehlo: batch buckets")
_LENGTHS = flags.DEFINE_list("lengths", ["16", "32", "64", "128"],
                             "stablehlo: source-length buckets (tokens, EOS included)")

_BEAM, _ALPHA, _EXTRA = define_search_flags()
flags.adopt_module_key_flags(command_line)  # so that --help lists them

# Each format's own flags; the other format's, given, are an error rather than ignored.
FORMAT_FLAGS = {"ctranslate2": (_QUANTIZATION, _MAX_POSITIONS),
                "stablehlo": (_BATCH_SIZES, _LENGTHS)}


def _options() -> dict:
    for fmt, own in FORMAT_FLAGS.items():
        given = [f"--{flag.name}" for flag in own if flags.FLAGS[flag.name].present]
        if fmt != _FORMAT.value and given:
            raise ExportError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} "
                              f"for --format={fmt}, not --format={_FORMAT.value}")
    if _FORMAT.value == "ctranslate2":
        return {"quantization": _QUANTIZATION.value, "max_positions": _MAX_POSITIONS.value}
    try:
        sizes = {flag.name: tuple(sorted({int(x) for x in flag.value}))
                 for flag in (_BATCH_SIZES, _LENGTHS)}
    except ValueError:
        sizes = None
    if not sizes or not all(sizes.values()) or min(min(s) for s in sizes.values()) < 1:
        raise ExportError("--batch_sizes and --lengths are lists of positive integers, "
                          "e.g. --lengths=16,32,64")
    return sizes


def main(argv) -> None:
    refuse_arguments(argv, "--workdir=runs/default --format=ctranslate2 --output=OUT")
    from transformer_jax.trained_params import CheckpointChoiceError, checkpoints_named

    logging.set_verbosity(logging.WARNING)
    one_line_warnings()
    try:
        manifest = export(_WORKDIR.value, _OUTPUT.value, fmt=_FORMAT.value,
                          checkpoint=_CHECKPOINT.value, force=_FORCE.value,
                          beam_size=_BEAM.value, alpha=_ALPHA.value,
                          max_extra_length=_EXTRA.value, **_options())
    except (ExportError, CheckpointChoiceError, DataError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print(f"exported {checkpoints_named(manifest['steps'])} of {_WORKDIR.value} to {_OUTPUT.value} "
          f"({_FORMAT.value}); translate with: python translate.py "
          f"--engine={_FORMAT.value} --exported={_OUTPUT.value}")


if __name__ == "__main__":
    with interrupt_in_one_line():
        app.run(main)
