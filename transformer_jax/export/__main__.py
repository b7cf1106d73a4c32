"""python -m transformer_jax.export --workdir=DIR --format=ctranslate2|stablehlo --output=OUT

    --checkpoint=latest|N|average:N     which parameters (§6.1 averages the last 5)
    --quantization=int8|float16|...     ctranslate2: the weights' type (default float32)
    --batch_sizes=1,8,32 --lengths=...  stablehlo: the buckets compiled ahead

Then `translate.py --engine=ctranslate2|stablehlo --exported=OUT` translates with it.
"""

import sys

from absl import app, flags, logging

from transformer_jax.command_line import one_line_warnings
from transformer_jax.export import FORMATS, ExportError, export
from transformer_jax.export.ctranslate2_model import QUANTIZATIONS
from transformer_jax.trained_params import CheckpointChoiceError

_WORKDIR = flags.DEFINE_string("workdir", None, "a training run's directory", required=True)
_FORMAT = flags.DEFINE_enum("format", None, FORMATS, "what to export to", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "the directory to write", required=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", "latest", "latest, a step, or average:N")
_FORCE = flags.DEFINE_bool("force", False, "replace --output if it exists")
_QUANTIZATION = flags.DEFINE_enum("quantization", None, QUANTIZATIONS,
                                  "ctranslate2: the weights' type (default: float32)")
_MAX_POSITIONS = flags.DEFINE_integer("max_positions", 1024, "ctranslate2: rows of the "
                                      "position table, the longest input or output",
                                      lower_bound=1)
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "stablehlo: batch buckets")
_LENGTHS = flags.DEFINE_list("lengths", ["16", "32", "64", "128"],
                             "stablehlo: source-length buckets (tokens, EOS included)")


def _options() -> dict:
    if _FORMAT.value == "ctranslate2":
        return {"quantization": _QUANTIZATION.value, "max_positions": _MAX_POSITIONS.value}
    if _QUANTIZATION.value:
        raise ExportError("--quantization is for --format=ctranslate2")
    try:
        sizes = {name: tuple(sorted({int(x) for x in flag.value}))
                 for name, flag in (("batch_sizes", _BATCH_SIZES), ("lengths", _LENGTHS))}
    except ValueError:
        raise ExportError("--batch_sizes and --lengths are lists of positive integers, "
                          "e.g. --lengths=16,32,64") from None
    return sizes  # export_stablehlo refuses sizes below 1


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    one_line_warnings()
    try:
        manifest = export(_WORKDIR.value, _OUTPUT.value, fmt=_FORMAT.value,
                          checkpoint=_CHECKPOINT.value, force=_FORCE.value, **_options())
    except (ExportError, CheckpointChoiceError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    steps = ", ".join(map(str, manifest["steps"]))
    print(f"exported checkpoint {steps} of {_WORKDIR.value} to {_OUTPUT.value} "
          f"({_FORMAT.value}); translate with: python translate.py "
          f"--engine={_FORMAT.value} --exported={_OUTPUT.value}")


if __name__ == "__main__":
    app.run(main)
