"""A trained run, exported to be served without this package's training code.

    python -m transformer_jax.export --workdir=runs/default --format=ctranslate2 --output=OUT
    python -m transformer_jax.export --workdir=runs/default --format=stablehlo --output=OUT

ctranslate2   a CTranslate2 model directory (`ctranslate2_model.py`), optionally quantized
stablehlo     `jax.export` artifacts of the encoder and the cached searches for a few
              batch/length buckets, and the parameters (`stablehlo.py`), which
              `serve_stablehlo.py` serves with jax alone

Each directory also holds export.json and the tokenizer (`manifest.py`).
"""

from transformer_jax.export.manifest import FORMATS, ExportError, check_output, \
    staged_directory, write_manifest

# Each format's options (keyword arguments of `export`), as `python -m transformer_jax.export`
# names them.
FORMAT_OPTIONS = {"ctranslate2": ("quantization", "max_positions"),
                  "stablehlo": ("batch_sizes", "lengths", "platforms")}
# ctranslate2's: ModelSpec.optimize's choices that a CPU or GPU runs (CTranslate2 converts at
# load time too), and the default rows of the position table, the longest input or output.
# Here, not in ctranslate2_model.py (JAX), for the command's flags.
QUANTIZATIONS = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16",
                 "int8_bfloat16", "int16")
MAX_POSITIONS = 1024


def export(workdir: str, output: str, *, fmt: str, checkpoint: str = "latest",
           force: bool = False, beam_size: int | None = None, alpha: float | None = None,
           max_extra_length: int | None = None, **options) -> dict:
    """Exports `workdir`'s parameters named by `checkpoint` (latest, a step, average:N) to
    `output` in format `fmt`; returns the manifest.

    The search settings (§6.1) left None are the run's `config.decode`: a stablehlo export
    compiles them, a ctranslate2 one records them as its defaults. `options` are the
    format's (`FORMAT_OPTIONS`): ctranslate2: quantization (None: float32), max_positions
    (1024); stablehlo: batch_sizes, lengths, platforms. Every argument and `output` are
    checked before the checkpoints are read; what is wrong is an ExportError.
    """
    from transformer_jax.data.tokenizer import Tokenizer
    from transformer_jax.data.vocabulary import other_tokenizer, tokenizer_path
    from transformer_jax.trained_params import load_trained_params
    from transformer_jax.translation import check_setting, search_settings

    if fmt not in FORMATS:
        # Python's keyword: the command line's --format takes only these (absl's enum).
        raise ExportError(f"fmt={fmt!r}: choose one of {', '.join(FORMATS)}")
    options = _checked_options(fmt, options)
    given = {"beam_size": beam_size, "alpha": alpha, "max_extra_length": max_extra_length}
    try:
        given = {key: check_setting(key, value) for key, value in given.items()}
    except (TypeError, ValueError) as error:
        raise ExportError(str(error)) from None
    check_output(output, force=force)
    trained = load_trained_params(workdir, checkpoint)
    tokenizer = Tokenizer.load(tokenizer_path(workdir))
    if why := other_tokenizer(trained.metadata, tokenizer):
        raise ExportError(f"{workdir}/checkpoints/{trained.steps[-1]} {why}")
    search = search_settings(trained.metadata["config"].get("decode"), **given)
    with staged_directory(output, force=force) as directory:
        if fmt == "ctranslate2":
            from transformer_jax.export.ctranslate2_model import export_ctranslate2

            pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
            extra = export_ctranslate2(trained, pieces, directory, search=search, **options)
        else:
            from transformer_jax.export.stablehlo import export_stablehlo

            extra = export_stablehlo(trained, directory, search=search, **options)
        return write_manifest(directory, fmt=fmt, workdir=workdir, trained=trained,
                              tokenizer=tokenizer, search=search, **extra)


def _checked_options(fmt: str, options: dict) -> dict:
    """`options` as the format takes them, or an ExportError naming the first it cannot."""
    for name in options:
        if name not in FORMAT_OPTIONS[fmt]:
            owner = [f for f, names in FORMAT_OPTIONS.items() if name in names]
            raise ExportError(f"{name} is an option of format {owner[0]}, not {fmt}" if owner
                              else f"{name} is no option of format {fmt}; its options are "
                                   f"{', '.join(FORMAT_OPTIONS[fmt])}")
    if fmt == "ctranslate2":
        from transformer_jax.export.ctranslate2_model import check_options
    else:
        from transformer_jax.export.stablehlo import check_options
    return check_options(**options)
