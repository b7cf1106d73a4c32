"""translate.py's engines behind one call: the run itself, or an export of it.

    engine = open_engine("ctranslate2", exported="exports/ct2")
    engine.translate(["dreihundertzwei"], beam_size=None, alpha=None, max_extra_length=None,
                     batch_size=32, max_input_length=64)

Every engine takes the same settings (None: the run's `config.decode`) and raises a
TranslationError for what it cannot do, so the CLI has one way to report it. An empty line
(its tokenization is empty) translates to "" with every engine.
"""

import os
from collections.abc import Callable
from typing import NamedTuple

from transformer_jax.export.manifest import ExportError
from transformer_jax.trained_params import checkpoints_named
from transformer_jax.translation import (SentenceTooLongError, TranslationError, Translator,
                                         sentence_list)

ENGINES = ("jax", "ctranslate2", "stablehlo")


class Engine(NamedTuple):
    translate: Callable[..., list[str]]  # Translator.translate's signature
    source: str  # which parameters, e.g. "checkpoint 800 of runs/default" (`checkpoints_named`)
    max_length: int  # the model's max_length: the default --max_input_length


def open_engine(name: str, *, workdir: str | None = None, exported: str | None = None,
                checkpoint: str = "latest") -> Engine:
    """The engine `name` over a training run (`workdir`, jax) or an export (`exported`)."""
    need, other = ("workdir", "exported") if name == "jax" else ("exported", "workdir")
    given = {"workdir": workdir, "exported": exported}
    folder = "a training run's folder" if name == "jax" else "the folder of an export"
    if given[other]:
        raise TranslationError(f"--engine={name} translates with --{need}=DIR, not --{other}")
    if given[need] is None and name == "jax":  # the default engine: no --engine was typed
        raise TranslationError("translating needs --workdir=DIR (a training run's folder), or "
                               "--engine=ctranslate2 or stablehlo with --exported=DIR")
    if given[need] is None:
        raise TranslationError(f"--engine={name} translates with --{need}=DIR ({folder})")
    if not os.fspath(given[need]).strip():
        raise TranslationError(f"--{need} is empty (an unset shell variable?); name {folder}")
    if name == "jax":
        translator = Translator.from_workdir(workdir, checkpoint)
        return Engine(translator.translate, f"{checkpoints_named(translator.steps)} of {workdir}",
                      translator.model.config.max_length)
    if checkpoint != "latest":
        raise TranslationError(f"--checkpoint is for --engine=jax; {exported} holds the "
                               f"parameters it was exported with")
    try:
        return _open_export(name, exported)
    except ExportError as error:
        raise TranslationError(str(error)) from None


def _open_export(name: str, directory: str) -> Engine:
    from transformer_jax.export.manifest import read_manifest

    manifest = read_manifest(directory, name)
    source = f"{name} export of {checkpoints_named(manifest['steps'])} of {manifest['workdir']}"
    if name == "ctranslate2":
        from transformer_jax.export.ctranslate2_model import CTranslate2Translator

        translate = CTranslate2Translator.from_export(directory).translate
    else:
        translate = _stablehlo(directory, manifest["search"])
    return Engine(translate, source, manifest["model"]["max_length"])


def _stablehlo(directory: str, exported: dict) -> Callable[..., list[str]]:
    """StableHLOTranslator.translate (an empty line is "" unsearched there too), refusing
    search settings other than those exported."""
    from transformer_jax.export import serve_stablehlo
    from transformer_jax.export.serve_stablehlo import StableHLOError, StableHLOTranslator

    try:
        translator = StableHLOTranslator(directory)
    except StableHLOError as error:
        raise TranslationError(str(error)) from None

    def translate(sentences, *, beam_size=None, alpha=None, max_extra_length=None, **rest):
        greedy = beam_size == 1 or (beam_size is None and exported["beam_size"] == 1)
        for key, value in (("alpha", None if greedy else alpha),  # greedy search has none
                           ("max_extra_length", max_extra_length)):
            if value is not None and value != exported[key]:
                raise TranslationError(
                    f"{directory} was exported with {key}={exported[key]}; export again "
                    f"with python -m transformer_jax.export --{key}={value} to change it")
        try:
            return translator.translate(sentence_list(sentences), beam_size=beam_size, **rest)
        except serve_stablehlo.SentenceTooLongError as error:
            raise SentenceTooLongError(str(error)) from None
        except StableHLOError as error:
            raise TranslationError(str(error)) from None

    return translate
