"""Translate with a stablehlo export (one that `python -m transformer_jax.export` made).

Self-contained: it imports the standard library, numpy and jax (and sentencepiece, for
text) and never transformer_jax or flax, so it can be copied next to an exported directory
and used where the package is not installed:

    from serve_stablehlo import StableHLOTranslator
    translator = StableHLOTranslator("exported")
    translator.translate(["dreihundertzweiundvierzig"])               # the exported beam search
    translator.translate(["dreihundertzweiundvierzig"], beam_size=1)  # greedy search
    translator.translate_ids([[31, 7, 1]])                            # ids in, ids out

Sources are batched as transformer_jax's predict.py batches them: sorted by length, and
each batch searched in the smallest exported bucket (rows x source length) that holds it.
"""

import hashlib
import json
import operator
import os
import sys
import zipfile

import jax
import numpy as np

# These mirror transformer_jax/token_ids.py.
PAD_ID = 0  # pads sources and outputs; outputs hold it after EOS
EOS_ID = 1  # ends every source and output

MANIFEST_FILE = "export.json"
TOKENIZER_FILE = "tokenizer.model"
ENTRY_KEYS = ("params", "platforms", "searches")  # what export.json's entry must hold


class StableHLOError(ValueError):
    """A directory that is no stablehlo export for this machine, or a request it cannot
    serve (a search it does not hold, a source longer than its longest bucket)."""


class SentenceTooLongError(StableHLOError):
    """A source of more tokens than max_input_length or the longest exported bucket: the
    others can still be translated."""


class StableHLOTranslator:
    """The searches of a stablehlo export, loaded once and compiled per bucket on first use."""

    def __init__(self, directory: str):
        self.directory = os.fspath(directory)
        self._entry, self._tokenizer_sha256, self._vocab_size = _read_entry(self.directory)
        platform = jax.export.default_export_platform()
        if platform not in self._entry["platforms"]:
            raise StableHLOError(
                f"{self.directory} was exported for {', '.join(self._entry['platforms'])}, "
                f"but jax runs on {platform} here; export it again on this machine")
        self._params = _load_params(os.path.join(self.directory, self._entry["params"]))
        self._functions = {}  # artifact file -> its jitted call
        self._tokenizer = None

    @property
    def searches(self) -> dict:
        """What was exported: {"greedy": {"beam_size": 1, "max_extra_length": ..., "buckets":
        [{"batch_size", "length", "max_length", "file"}, ...]}, "beam": {... "alpha" ...}}."""
        return json.loads(json.dumps(self._entry["searches"]))  # a copy

    def translate_ids(self, source_ids: list[list[int]], *, beam_size: int | None = None,
                      batch_size: int | None = None, progress: bool = False) -> list[np.ndarray]:
        """The output ids of each source (ids ending with EOS), in the sources' order.

        `beam_size` None is the exported beam search (greedy if none was exported), 1 greedy
        search. At most `batch_size` sources share a search (None, or more than the largest
        exported batch size: that size). Each output is a 1-D int32 array of the bucket's
        max_length: generated ids, EOS included, 0 after.
        """
        search = self._search(beam_size)
        largest = max(b["batch_size"] for b in search["buckets"])
        rows = largest if batch_size is None else min(_count("batch_size", batch_size), largest)
        _check_ids(source_ids, self._vocab_size)
        self._check_lengths(source_ids, search["buckets"])
        order = sorted(range(len(source_ids)), key=lambda i: len(source_ids[i]))
        outputs = [np.zeros((0,), np.int32)] * len(source_ids)
        starts = range(0, len(order), rows)
        try:  # an error or Ctrl-C ends the progress line too, before the error is said
            for done, start in enumerate(starts):
                chosen = order[start:start + rows]
                bucket = _smallest_bucket(search["buckets"], len(chosen),
                                          max(len(source_ids[i]) for i in chosen))
                outputs_BT = self._run(bucket, _padded([source_ids[i] for i in chosen], bucket))
                for i, output_T in zip(chosen, outputs_BT):
                    outputs[i] = output_T
                if progress:
                    print(f"\rtranslating: batch {done + 1}/{len(starts)}", end="", file=sys.stderr)
        finally:
            if progress:
                print(file=sys.stderr)
        return outputs

    def translate(self, sentences: list[str], *, beam_size: int | None = None,
                  batch_size: int | None = None, max_input_length: int | None = None,
                  progress: bool = False) -> list[str]:
        """Translations of `sentences`, in their order (`translate_ids` on their pieces).

        A sentence of more than `max_input_length` tokens (EOS included; None: no limit
        but the longest bucket) is a StableHLOError before any search; one str instead of
        a list, a TypeError.
        """
        if isinstance(sentences, (str, bytes)):  # translation.sentence_list's words
            raise TypeError(f"translate takes a list of sentences, not one "
                            f"{type(sentences).__name__}: pass [sentence]")
        tokenizer = self._load_tokenizer()
        # Whitespace alone is an empty line, as in transformer_jax's translation.sentence_list.
        sentences = ["" if isinstance(s, str) and not s.strip() else s for s in sentences]
        ids = [pieces + [EOS_ID] for pieces in tokenizer.encode(sentences, out_type=int)]
        cap = (float("inf") if max_input_length is None  # no limit but the longest bucket
               else _count("max_input_length", max_input_length))
        _refuse_too_long(ids, cap, f"max_input_length={cap}",
                         "split it or raise the limit (--max_input_length)")
        # An empty line (no pieces) is "" unsearched, as transformer_jax's predict.skip_empty.
        searched = [i for i, x in enumerate(ids) if len(x) > 1]
        if searched:  # numbered among all the sentences, not only the searched ones
            self._check_lengths(ids, self._search(beam_size)["buckets"])
        outputs = self.translate_ids([ids[i] for i in searched], beam_size=beam_size,
                                     batch_size=batch_size, progress=progress) if searched else []
        texts = [""] * len(ids)
        for i, output in zip(searched, outputs):
            # As transformer_jax's Tokenizer.decode: up to the first EOS, PAD ids dropped.
            texts[i] = tokenizer.decode([int(t) for t in _until_eos(output) if t != PAD_ID])
        return texts

    def _search(self, beam_size: int | None) -> dict:
        searches = self._entry["searches"]
        if beam_size is None:
            return searches.get("beam", searches["greedy"])
        beam_size = _count("beam_size", beam_size)
        for search in searches.values():
            if search["beam_size"] == beam_size:
                return search
        held = ", ".join(f"{s['beam_size']} ({name})" for name, s in searches.items())
        raise StableHLOError(f"beam_size {beam_size} was not exported; {self.directory} "
                             f"holds beam_size {held}")

    def _check_lengths(self, source_ids, buckets) -> None:
        longest = max(b["length"] for b in buckets)
        _refuse_too_long(source_ids, longest, f"the longest exported bucket ({longest})",
                         "split it or export longer lengths")

    def _run(self, bucket: dict, inputs_BS: np.ndarray) -> np.ndarray:
        """The bucket's artifact on `inputs_BS`, deserialized and compiled on first use."""
        if bucket["file"] not in self._functions:
            path = os.path.join(self.directory, bucket["file"])
            try:
                with open(path, "rb") as f:
                    blob = bytearray(f.read())
                exported = jax.export.deserialize(blob)
            except ImportError:  # jax reads the artifact with the flatbuffers package
                raise StableHLOError("reading a stablehlo export needs the flatbuffers "
                                     "package (pip install flatbuffers)") from None
            except OSError as error:
                raise StableHLOError(f"cannot read {path}: {error.strerror or error}; "
                                     f"export again") from None
            except Exception as error:  # noqa: BLE001 -- flatbuffers' struct.error, ...
                raise StableHLOError(f"{path} is not a jax.export artifact (damaged?): "
                                     f"{type(error).__name__}: {error}; export again") from None
            self._check_params(exported)
            self._functions[bucket["file"]] = jax.jit(exported.call)
        return np.asarray(self._functions[bucket["file"]](self._params, inputs_BS))

    def _check_params(self, exported) -> None:
        """A StableHLOError where params.npz's leaves are not those `exported` takes: a
        params.npz of another model or a damaged one (jax's words name no file)."""
        path = os.path.join(self.directory, self._entry["params"])
        wanted = exported.in_avals[:-1]  # the arguments: the leaves, then inputs_BS
        if len(wanted) != len(self._params):
            raise StableHLOError(f"{path} holds {len(self._params)} parameter arrays, the "
                                 f"exported model takes {len(wanted)}; export again")
        for i, (aval, leaf) in enumerate(zip(wanted, self._params)):
            if aval.shape != leaf.shape or aval.dtype != leaf.dtype:
                raise StableHLOError(
                    f"{path} does not fit the exported model: its array {i} is "
                    f"{leaf.dtype}{list(leaf.shape)}, the model takes "
                    f"{aval.dtype}{list(aval.shape)}; export again")

    def _load_tokenizer(self):
        if self._tokenizer is None:
            import sentencepiece  # only text needs it

            path = os.path.join(self.directory, TOKENIZER_FILE)
            try:
                with open(path, "rb") as f:
                    proto = f.read()
            except FileNotFoundError:
                raise StableHLOError(f"{self.directory} has no {TOKENIZER_FILE}") from None
            except OSError as error:
                raise StableHLOError(f"cannot read {path}: {error.strerror or error}") from None
            # The SHA-256 of the model's bytes, as transformer_jax's Tokenizer.sha256.
            exported = self._tokenizer_sha256 or hashlib.sha256(proto).hexdigest()
            if hashlib.sha256(proto).hexdigest() != exported:
                raise StableHLOError(f"{path} is not the tokenizer this model was exported "
                                     f"with (its SHA-256 differs from export.json's); "
                                     f"export again")
            try:
                self._tokenizer = sentencepiece.SentencePieceProcessor(model_proto=proto)
            except RuntimeError:
                raise StableHLOError(f"{path} is damaged (not a SentencePiece model); "
                                     f"export again") from None
        return self._tokenizer


def _read_entry(directory: str) -> tuple[dict, str | None, int | None]:
    """export.json's "stablehlo" entry, its tokenizer's SHA-256 and its model's vocab_size
    (None in exports that lack them); a StableHLOError unless it is a stablehlo export."""
    path = os.path.join(directory, MANIFEST_FILE)
    if os.path.isfile(directory):  # export.json itself: "Not a directory"
        raise StableHLOError(f"{directory}: a file, not an exported model's folder (the "
                             f"folder holding {MANIFEST_FILE})")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise StableHLOError(f"{directory} is not an exported model (no {MANIFEST_FILE})") \
            from None
    except (OSError, ValueError) as error:
        raise StableHLOError(f"{path} cannot be read: {error}") from None
    if not isinstance(manifest, dict) or "format" not in manifest:
        raise StableHLOError(f"{path} holds no export's format; export again")
    if manifest["format"] != "stablehlo":
        raise StableHLOError(f"{directory} holds a {manifest['format']} export, not stablehlo")
    entry = manifest.get("stablehlo")
    missing = [key for key in ENTRY_KEYS if not isinstance(entry, dict) or key not in entry]
    if missing:
        raise StableHLOError(f"{path} lacks stablehlo.{', stablehlo.'.join(missing)}; "
                             f"export again")
    if problem := _malformed_searches(entry["searches"]):  # edited by hand
        raise StableHLOError(f"{path}: stablehlo.searches{problem}; export again")
    vocab_size = (manifest.get("model") or {}).get("vocab_size")
    return entry, manifest.get("tokenizer_sha256"), vocab_size if isinstance(vocab_size,
                                                                          int) else None


def _malformed_searches(searches) -> str | None:
    """What in export.json's searches is not as the export writes it (a KeyError or a
    TypeError in a search), or None."""
    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(searches, dict) or not searches or not set(searches) <= {"greedy",
                                                                               "beam"}:
        return " must hold a greedy or a beam search, or both"
    for name, search in searches.items():
        if not isinstance(search, dict) or not all(
                whole(search.get(key)) for key in ("beam_size", "max_extra_length")):
            return f".{name} must hold its beam_size and max_extra_length"
        buckets = search.get("buckets")
        if not isinstance(buckets, list) or not buckets or not all(
                isinstance(b, dict) and isinstance(b.get("file"), str) and all(
                    whole(b.get(key)) for key in ("batch_size", "length", "max_length"))
                for b in buckets):
            return (f".{name}.buckets must be a list of buckets, each with its batch_size, "
                    f"length, max_length and file")
    return None


def _load_params(path: str) -> tuple:
    """The parameter leaves on the default device, in the order of their keys."""
    try:
        with np.load(path) as npz:
            return tuple(jax.device_put(npz[key]) for key in sorted(npz.files))
    except OSError as error:
        raise StableHLOError(f"cannot read {path}: {error.strerror or error}") from None
    # Not an .npz (numpy's ValueError proposes to unpickle it), empty, or cut short.
    except (ValueError, EOFError, zipfile.BadZipFile) as error:
        raise StableHLOError(f"{path} is not the parameters the export wrote (damaged?): "
                             f"{type(error).__name__}; export again") from None


def _check_ids(source_ids, vocab_size: int | None) -> None:
    """A StableHLOError for a source that is no list of token ids ending with EOS: empty,
    not integers, or outside [0, vocab_size) (ids of another vocabulary searched into
    nonsense; an empty source, into a full-length output)."""
    for number, ids in enumerate(source_ids, start=1):
        ids = np.asarray(ids)
        if ids.ndim != 1 or not ids.size or ids.dtype.kind not in "iu":
            raise StableHLOError(f"source {number} is not a list of token ids ending with EOS "
                                 f"({EOS_ID}): {ids.tolist()!r}")
        if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
            # an export.json without the model's vocab_size bounds the ids below only
            bounds = (f"outside the model's vocabulary [0, {vocab_size})"
                      if vocab_size is not None else "below 0, which no vocabulary holds")
            raise StableHLOError(f"source {number} holds ids {bounds}: {ids.min()} to "
                                 f"{ids.max()}")


def _refuse_too_long(source_ids, cap, limit: str, advice: str) -> None:
    """A SentenceTooLongError naming the first source of more than `cap` ids, in the words
    of transformer_jax's translation.check_lengths (this file imports nothing of it)."""
    too_long = [(i, len(x)) for i, x in enumerate(source_ids) if len(x) > cap]
    if too_long:
        line, length = too_long[0]
        which, count = (("the sentence", "") if len(source_ids) == 1 else
                        (f"sentence {line + 1}", f" ({len(too_long)} sentence(s) too long)"))
        raise SentenceTooLongError(f"{which} has {length} tokens, more than {limit}{count}; "
                                   f"{advice}")


def _count(name: str, value) -> int:
    """`value` as a positive int (a NumPy integer too); a StableHLOError for anything else,
    a bool included (True would be 1: greedy search for beam_size=True). The rule of
    transformer_jax's argument_checks.positive_int, which this file cannot import."""
    try:
        number = None if isinstance(value, (bool, np.bool_)) else operator.index(value)
    except TypeError:  # a float, a str, ...
        number = None
    if number is None or number < 1:
        raise StableHLOError(f"{name} must be a positive integer, got {value!r}")
    return number


def _smallest_bucket(buckets: list[dict], rows: int, length: int) -> dict:
    """The bucket of fewest cells with at least `rows` rows and `length` columns."""
    fits = [b for b in buckets if b["batch_size"] >= rows and b["length"] >= length]
    return min(fits, key=lambda b: (b["batch_size"] * b["length"], b["length"]))


def _padded(rows: list[list[int]], bucket: dict) -> np.ndarray:
    """`rows` as the bucket's int32 `(B, S)` inputs, PAD_ID around them."""
    inputs_BS = np.full((bucket["batch_size"], bucket["length"]), PAD_ID, np.int32)
    for row, ids in enumerate(rows):
        inputs_BS[row, :len(ids)] = ids
    return inputs_BS


def _until_eos(ids: np.ndarray) -> np.ndarray:
    ends = np.flatnonzero(ids == EOS_ID)
    return ids[:ends[0]] if ends.size else ids
