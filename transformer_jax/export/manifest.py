"""What every exported directory holds beside its format's files, and how it is written.

    OUT/export.json      format, source workdir and steps, the model's config, the search
                         settings of §6.1 the run decodes with, and the format's own keys
    OUT/tokenizer.model  the run's SentencePiece model (the same pieces as the vocabulary)

A directory is written whole or not at all: into a temporary sibling, renamed into
place last, so an interrupted export leaves no half-written model behind.
"""

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile

from transformer_jax.data.vocabulary import TOKENIZER_FILE, tokenizer_path

MANIFEST_FILE = "export.json"
MANIFEST_KEYS = ("format", "workdir", "steps", "model", "search")  # what readers use
FORMATS = ("ctranslate2", "stablehlo")


class ExportError(ValueError):
    """An export that cannot be made or read: a setting the format cannot express, an
    output that exists, a directory that is not an export of the expected format."""


@contextlib.contextmanager
def staged_directory(output: str, *, force: bool = False):
    """Yields a temporary folder beside `output`; renamed to `output` when the block ends
    without an error (replacing it when `force`: the old one is renamed aside first, then
    deleted, so a kill in between leaves it whole), deleted otherwise.

    `force` replaces an earlier export only (a folder with export.json), never the folder
    the command runs in or one above it: a mistyped `--output` (empty, `.`, a workdir)
    would otherwise delete whatever it named."""
    if not output:
        raise ExportError("--output is empty; name the folder to write")
    output = os.path.abspath(output)
    if os.path.exists(output):
        if not force:
            raise ExportError(f"--output {output} exists; choose another or pass --force")
        if not os.path.isfile(os.path.join(output, MANIFEST_FILE)):
            raise ExportError(f"--output {output} exists and is no export (no "
                              f"{MANIFEST_FILE}); --force replaces only an earlier export")
        real = os.path.realpath(output)  # getcwd() is a real path, with no symlink in it
        if os.path.commonpath([real, os.path.realpath(os.getcwd())]) == real:
            raise ExportError(f"--output {output} holds the current folder; --force would "
                              f"move it away from under this command; choose another")
    parent = os.path.dirname(output)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.partial-", dir=parent)
    except OSError as error:  # a file in the path, or no permission
        raise ExportError(f"--output's folder {parent} is not a writable folder: "
                          f"{error.strerror or error}") from None
    try:
        yield staging
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would hide it from other users
        replaced = f"{staging}.replaced"
        if os.path.exists(output):
            os.rename(output, replaced)
        os.rename(staging, output)
        if os.path.islink(replaced):  # --output was a link to the old export: the link goes
            os.remove(replaced)
        shutil.rmtree(replaced, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_manifest(directory: str, *, fmt: str, workdir: str, trained, search: dict,
                   **extra) -> dict:
    """export.json for `trained` (a `TrainedParams`) and a copy of `workdir`'s tokenizer."""
    shutil.copyfile(tokenizer_path(workdir), os.path.join(directory, TOKENIZER_FILE))
    manifest = {"format": fmt, "workdir": os.path.abspath(workdir), "steps": trained.steps,
                "model": dataclasses.asdict(trained.model.config),
                "direction": _direction(trained.metadata), "search": search, **extra}
    with open(os.path.join(directory, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def read_manifest(directory: str, fmt: str) -> dict:
    """`directory`'s export.json; an ExportError unless it is an export in format `fmt`."""
    path = os.path.join(directory, MANIFEST_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"{directory} is not an exported model (no {MANIFEST_FILE}); make "
                          f"one with python -m transformer_jax.export") from None
    except (OSError, ValueError) as error:
        raise ExportError(f"{path} cannot be read: {error}") from None
    if not isinstance(manifest, dict):
        raise ExportError(f"{path} holds no export's record; export again")
    if missing := [key for key in MANIFEST_KEYS if key not in manifest]:
        raise ExportError(f"{path} lacks {', '.join(missing)}; export again")
    if manifest["format"] != fmt:
        raise ExportError(f"{directory} holds a {manifest['format']} export, not "
                          f"{fmt}; pass --engine={manifest['format']}")
    return manifest


def _direction(metadata: dict) -> str:
    data = metadata.get("config", {}).get("data", {})
    return f"{data.get('source_lang', '?')}-{data.get('target_lang', '?')}"
