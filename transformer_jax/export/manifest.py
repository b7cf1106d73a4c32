"""What every exported directory holds beside its format's files, and how it is written.

    OUT/export.json      format, source workdir and steps, the model's config, the search
                         settings of §6.1 it decodes with, the tokenizer's SHA-256, the
                         format's own keys, the files, the package version and the time
    OUT/tokenizer.model  the run's SentencePiece model (the same pieces as the vocabulary)

A directory is written whole or not at all: into a temporary sibling, renamed into
place last, so an interrupted export leaves no half-written model behind.
"""

import contextlib
import dataclasses
import datetime
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


def check_output(output: str, *, force: bool = False) -> str:
    """`output` as an absolute path, if an export may be written there; an ExportError
    naming why not. Checked before the checkpoints are read, which may take minutes.

    A new folder or an empty one is written; `force` replaces an earlier export (a folder
    with export.json), never another folder, nor the one the command runs in or one above
    it: a mistyped `--output` (`.`, a workdir) would otherwise delete whatever it named."""
    if not output:
        raise ExportError("--output is empty; name the folder to write")
    output = os.path.abspath(output)
    if os.path.isfile(output):
        raise ExportError(f"--output {output} is a file; name a folder to write")
    if os.path.exists(output):
        real = os.path.realpath(output)  # getcwd() is a real path, with no symlink in it
        if os.path.commonpath([real, os.path.realpath(os.getcwd())]) == real:
            raise ExportError(f"--output {output} holds the current folder; writing there "
                              f"would move it away from under this command; choose another")
        if os.path.isfile(os.path.join(output, MANIFEST_FILE)):
            if not force:
                raise ExportError(f"--output {output} holds an earlier export; choose "
                                  f"another or pass --force to replace it")
        elif os.listdir(output):  # an empty folder (made for it) is written into
            raise ExportError(f"--output {output} is a folder that holds other files (no "
                              f"{MANIFEST_FILE}); choose another")
    parent = os.path.dirname(output)
    while parent and not os.path.exists(parent):  # the first folder that is there
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ExportError(f"--output {output} cannot be made: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"--output {output} cannot be made: {parent} is not writable")
    return output


@contextlib.contextmanager
def staged_directory(output: str, *, force: bool = False):
    """Yields a temporary folder beside `output`; renamed to `output` when the block ends
    without an error (replacing it when `force`: the old one is renamed aside first, then
    deleted, so a kill in between leaves it whole), deleted otherwise. `output` is checked
    first (`check_output`)."""
    output = check_output(output, force=force)
    parent = os.path.dirname(output)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.partial-", dir=parent)
    except OSError as error:  # what check_output cannot foresee: a read-only file system
        raise ExportError(f"--output {output} cannot be made: {error.strerror or error}") \
            from None
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


def write_manifest(directory: str, *, fmt: str, workdir: str, trained, tokenizer,
                   search: dict, **extra) -> dict:
    """export.json for `trained` (a `TrainedParams`) and a copy of `workdir`'s tokenizer
    (`tokenizer`, whose SHA-256 the engines check), written last: it lists the files."""
    from importlib import metadata

    shutil.copyfile(tokenizer_path(workdir), os.path.join(directory, TOKENIZER_FILE))
    manifest = {"format": fmt, "workdir": os.path.abspath(workdir), "steps": trained.steps,
                "model": dataclasses.asdict(trained.model.config),
                "direction": _direction(trained.metadata), "search": search,
                "tokenizer_sha256": tokenizer.sha256, **extra,
                "files": sorted([*os.listdir(directory), MANIFEST_FILE]),
                "transformer_jax_version": metadata.version("transformer_jax"),
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
    with open(os.path.join(directory, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def read_manifest(directory: str, fmt: str) -> dict:
    """`directory`'s export.json; an ExportError unless it is an export in format `fmt`."""
    path = os.path.join(directory, MANIFEST_FILE)
    if os.path.isfile(directory):  # model.bin or export.json itself: "Not a directory"
        raise ExportError(f"{directory}: a file, not an exported model's folder (the folder "
                          f"holding {MANIFEST_FILE})")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ExportError(_not_an_export(directory)) from None
    except (OSError, ValueError) as error:
        raise ExportError(f"{path} cannot be read: {error}") from None
    if not isinstance(manifest, dict):
        raise ExportError(f"{path} holds no export's record; export again")
    if missing := [key for key in MANIFEST_KEYS if key not in manifest]:
        raise ExportError(f"{path} lacks {', '.join(missing)}; export again")
    if problem := _malformed(manifest):  # edited by hand: a KeyError or TypeError later
        raise ExportError(f"{path}: {problem}; export again")
    if manifest["format"] != fmt:
        raise ExportError(f"{directory} holds a {manifest['format']} export, not "
                          f"{fmt}; pass --engine={manifest['format']}")
    return manifest


def _malformed(manifest: dict) -> str | None:
    """What in the keys that readers use is not as `write_manifest` writes it, or None."""
    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    steps, model, search = manifest["steps"], manifest["model"], manifest["search"]
    if not isinstance(steps, list) or not steps or not all(whole(s) for s in steps):
        return f"steps must be a list of checkpoint steps, got {steps!r}"
    if not isinstance(model, dict) or not whole(model.get("max_length")):
        return "model.max_length must be an integer"
    if not isinstance(search, dict) or not all(
            whole(search.get(key)) for key in ("beam_size", "max_extra_length")) or not (
            isinstance(search.get("alpha"), (int, float))):
        return "search must hold beam_size, alpha and max_extra_length"
    return None


def _not_an_export(directory: str) -> str:
    """Why `directory`, with no export.json, is no export, and what to pass instead."""
    if not os.path.isdir(directory):
        return f"{directory}: no such folder (an exported model)"
    if os.path.isdir(os.path.join(directory, "checkpoints")):
        return (f"{directory} is a training run, not an export; translate with --engine=jax "
                f"--workdir={directory}, or export it with python -m transformer_jax.export")
    return (f"{directory} is not an exported model (no {MANIFEST_FILE}); make one with "
            f"python -m transformer_jax.export")


def _direction(metadata: dict) -> str:
    data = metadata.get("config", {}).get("data", {})
    return f"{data.get('source_lang', '?')}-{data.get('target_lang', '?')}"
