"""A trained run, exported to be served without this package's training code.

    python -m transformer_jax.export --workdir=runs/default --format=ctranslate2 --output=OUT
    python -m transformer_jax.export --workdir=runs/default --format=stablehlo --output=OUT

ctranslate2   a CTranslate2 model directory (`ctranslate2_model.py`), optionally quantized
stablehlo     `jax.export` artifacts of the encoder and the cached searches for a few
              batch/length buckets, and the parameters (`stablehlo.py`), which
              `serve_stablehlo.py` serves with jax alone

Each directory also holds export.json and the tokenizer (`manifest.py`).
"""

from transformer_jax.export.manifest import FORMATS, ExportError, read_manifest, \
    staged_directory, write_manifest


def export(workdir: str, output: str, *, fmt: str, checkpoint: str = "latest",
           force: bool = False, **options) -> dict:
    """Exports `workdir`'s parameters named by `checkpoint` (latest, a step, average:N) to
    `output` in format `fmt`; returns the manifest. `options` are the format's:
    ctranslate2: quantization, max_positions; stablehlo: batch_sizes, lengths, platforms."""
    from transformer_jax.data.tokenizer import Tokenizer
    from transformer_jax.data.vocabulary import other_tokenizer, tokenizer_path
    from transformer_jax.trained_params import load_trained_params
    from transformer_jax.translation import search_settings

    if fmt not in FORMATS:
        raise ExportError(f"--format={fmt!r}: choose one of {', '.join(FORMATS)}")
    trained = load_trained_params(workdir, checkpoint)
    if why := other_tokenizer(trained.metadata, Tokenizer.load(tokenizer_path(workdir))):
        raise ExportError(f"{workdir}/checkpoints/{trained.steps[-1]} {why}")
    search = search_settings(trained.metadata["config"].get("decode"))
    with staged_directory(output, force=force) as directory:
        if fmt == "ctranslate2":
            from transformer_jax.export import ctranslate2_model

            tokenizer = Tokenizer.load(tokenizer_path(workdir))
            pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
            quantization = options.pop("quantization", None)
            spec = ctranslate2_model.transformer_spec(trained.model.config, trained.params,
                                                      pieces, **options)
            ctranslate2_model.save_model(spec, directory, quantization)
            extra = {"quantization": quantization or "float32", **options}
        else:
            from transformer_jax.export.stablehlo import export_stablehlo

            extra = export_stablehlo(trained, directory, search=search, **options)
        return write_manifest(directory, fmt=fmt, workdir=workdir, trained=trained,
                              search=search, **extra)
