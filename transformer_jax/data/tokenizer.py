"""SentencePiece subwords, one vocabulary shared by source and target (§5.1).

The paper encodes WMT 2014 English-German with byte-pair encoding and a shared
vocabulary of about 37000 tokens. This module trains such a vocabulary in
process from sentences (both languages) and wraps the `sentencepiece` model in
a small `Tokenizer`. Which sentences, and where the model is kept, is
`vocabulary.py`'s business.

Every model has the special ids of `transformer_jax.token_ids`, so batches and
the model agree on them: PAD_ID 0, EOS_ID 1 (appended with
`encode(..., add_eos=True)`), BOS_ID 2 (reserved) and UNK_ID 3 (never emitted
for text, thanks to byte fallback).

Training settings make encoding lossless, `decode(encode(s)) == s` for every
string: identity normalization (no NFKC), whitespace kept as is, and byte
fallback, so a character never seen in training becomes its UTF-8 bytes
(256 byte pieces) instead of UNK. Digits are split, one piece each.

Training is reproducible: the same sentences and arguments give a byte-identical
model in every process, whatever the machine's core count. So every sentence
given trains the model. SentencePiece's own sampling (`input_sentence_size`
with `shuffle_input_sentence`) is not used: its sampler draws from an
absl::BitGen, which absl salts with per-process entropy, so even its fixed
seed gives another sample, and another model, in every process.
"""

import hashlib
import io
import itertools
import os
import re
import warnings
from collections.abc import Iterable

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from transformer_jax.data.sources import DataError
from transformer_jax.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

MODEL_TYPES = ("bpe", "unigram")
# 4 specials + 256 byte pieces, plus one piece per distinct character of the corpus.
MIN_VOCAB_SIZE = 4 + 256 + 1  # the specials, the bytes and one character
# Fixed rather than os.cpu_count(): unigram scores depend on the thread count
# (float sums split across threads), and a model should not depend on the machine.
_NUM_THREADS = 4


class Tokenizer:
    """A trained SentencePiece model with the fixed special ids above.

    Built from the serialized model proto (the bytes of a .model file), so it
    pickles as those bytes, e.g. into grain worker processes.
    """

    def __init__(self, model_proto: bytes):
        self._model_proto = bytes(model_proto)
        self._sp = _processor(self._model_proto)
        found = (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id())
        if found != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
            raise ValueError(
                f"SentencePiece model has special ids pad/eos/bos/unk = {found}, expected "
                f"{(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}; train it with train_tokenizer")

    def __reduce__(self):
        return (Tokenizer, (self._model_proto,))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, sha256={self.sha256[:12]}...)"

    @property
    def vocab_size(self) -> int:
        """Number of pieces, specials and byte pieces included: the model's V."""
        return self._sp.get_piece_size()

    @property
    def model_proto(self) -> bytes:
        """The serialized model: the bytes of a .model file."""
        return self._model_proto

    @property
    def sha256(self) -> str:
        """The SHA-256 of `model_proto` (hex): the model's identity in the records of the
        vocabulary and of the ids prepared with it."""
        return proto_sha256(self._model_proto)

    def id_to_piece(self, i: int) -> str:
        """The piece of id `i`, e.g. "▁the", "<0xF0>" or "</s>"; for inspection."""
        return self._sp.id_to_piece(int(i))

    def encode(self, text: str, *, add_eos: bool = False) -> list[int]:
        """Ids of `text`; never PAD, EOS or BOS unless `add_eos` appends one EOS."""
        # Keyword arguments only: the second positional of sentencepiece's encode is add_bos.
        return self._sp.encode(text, out_type=int, add_eos=add_eos)

    def encode_batch(self, texts: Iterable[str], *, add_eos: bool = False,
                     num_threads: int = 1) -> list[list[int]]:
        """`encode` of each text, in one sentencepiece call (faster than a loop), on
        `num_threads` of sentencepiece's threads."""
        return self._sp.encode(list(texts), out_type=int, add_eos=add_eos,
                               num_threads=num_threads)

    def encode_arrays(self, texts: Iterable[str], *, dtype, add_eos: bool = False,
                      num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """`encode_batch` as two arrays: each text's id count (int64), and the ids end to
        end (`dtype`), the layout of prepared splits."""
        ids = self.encode_batch(texts, add_eos=add_eos, num_threads=num_threads)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return lengths, np.fromiter(itertools.chain.from_iterable(ids), dtype,
                                    int(lengths.sum()))

    def decode(self, ids) -> str:
        """Text of a list or 1-D int array, up to the first EOS, PAD ids dropped.

        So a model output row `[ids..., EOS, anything..., PAD, PAD]` decodes to
        the text before its EOS.
        """
        return self._sp.decode(_strip(ids))

    def decode_batch(self, rows) -> list[str]:
        """`decode` of each row of a 2-D array (or a list of id lists)."""
        if not isinstance(rows, (list, tuple)):
            rows = np.asarray(rows)
            if rows.ndim != 2:
                raise ValueError(f"decode_batch expects a 2-D array, got shape {rows.shape}")
        if len(rows) == 0:
            return []  # sentencepiece would read [] as one empty row and return ""
        return self._sp.decode([_strip(row) for row in rows])

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """The tokenizer whose model proto is the file at `path`: FileNotFoundError if there
        is none, DataError naming it if it is not a whole model (e.g. cut short)."""
        try:
            with open(path, "rb") as f:
                model_proto = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"No tokenizer model at {os.fspath(path)!r}; a run trains one when it first "
                "starts and saves it in its workdir (get_tokenizer)."
            ) from None
        try:
            return cls(model_proto)
        except ValueError as error:
            raise DataError(
                f"{os.fspath(path)} is damaged ({error}): restore it from a copy, or run python "
                "-m transformer_jax.data prepare with its run's config and workdir, which "
                "trains it again if its record shows that the same model comes out") from None


def proto_sha256(model_proto: bytes) -> str:
    """The SHA-256 (hex) of a SentencePiece model's bytes: a tokenizer's identity
    (`Tokenizer.sha256`), readable before the bytes are parsed."""
    return hashlib.sha256(model_proto).hexdigest()


def _processor(model_proto: bytes) -> spm.SentencePieceProcessor:
    """The model of `model_proto`; ValueError if those bytes are not a whole model.

    A model cut short at the boundary of a field can still parse: cut before its
    normalizer spec, it would normalize with NFKC and drop repeated spaces (no longer
    lossless), so that spec, which the trainer always writes, must be there.
    """
    try:
        processor = spm.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError:  # sentencepiece's only word on it: "ParseFromArray" failed
        raise ValueError(f"not a SentencePiece model: {len(model_proto):,} bytes that do not "
                         "parse") from None
    parsed = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    if not parsed.HasField("normalizer_spec"):
        raise ValueError(f"a SentencePiece model cut short: {len(model_proto):,} bytes, "
                         "no normalizer spec")
    return processor


def _strip(ids) -> list[int]:
    """Ids up to the first EOS, without PAD, as Python ints for sentencepiece."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"decode expects a 1-D sequence of ids, got shape {ids.shape}")
    ends = np.flatnonzero(ids == EOS_ID)
    if ends.size:
        ids = ids[: ends[0]]
    return ids[ids != PAD_ID].astype(np.int64).tolist()


def train_tokenizer(
    sentences: Iterable[str],
    vocab_size: int,
    *,
    model_type: str = "bpe",
) -> Tokenizer:
    """Trains a shared vocabulary of `vocab_size` pieces on all of `sentences`.

    Args:
      sentences: training text, source and target sides together. Empty
        strings are skipped. All of them are held in memory while training,
        so pass a sample of a large corpus (`vocabulary.training_sentences`).
      vocab_size: pieces in the vocabulary, 4 specials and 256 byte pieces
        included. If the corpus cannot fill it, the vocabulary is smaller and
        a warning says so; if it is below 260 plus the number of distinct
        characters in the corpus, ValueError.
      model_type: "bpe" (the paper's byte-pair encoding) or "unigram".

    The same sentences (in the same order) and arguments give a byte-identical model.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: byte fallback needs 4 special and 256 "
            f"byte pieces plus one per distinct character, at least {MIN_VOCAB_SIZE}")

    # Peek so an empty corpus is a clear error rather than sentencepiece's bare check.
    corpus = (s for s in sentences if s)
    first = next(corpus, None)
    if first is None:
        raise ValueError("train_tokenizer got no non-empty sentences")

    tokenizer = Tokenizer(_train_sentencepiece(itertools.chain([first], corpus), vocab_size,
                                               model_type))
    if tokenizer.vocab_size < vocab_size:
        warnings.warn(
            f"Requested vocab_size {vocab_size}, but the corpus supports only "
            f"{tokenizer.vocab_size} {model_type} pieces; using {tokenizer.vocab_size}.",
            stacklevel=2)
    return tokenizer


def _train_sentencepiece(sentences, vocab_size: int, model_type: str) -> bytes:
    """The serialized model: lossless settings, the fixed special ids."""
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences,
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            bos_id=BOS_ID,
            unk_id=UNK_ID,  # must be set: its default, 0, would clash with pad_id
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            byte_fallback=True,
            character_coverage=1.0,
            split_digits=True,
            hard_vocab_limit=False,  # cap at what the corpus supports; the caller warns
            input_sentence_size=0,  # all of them: its sampling differs per process (above)
            num_threads=_NUM_THREADS,
            minloglevel=2,  # errors only; training logs every step otherwise
        )
    except RuntimeError as e:
        found = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(e))
        if found is None:
            raise
        raise ValueError(
            f"vocab_size {vocab_size} is too small for this corpus: byte fallback with full "
            f"character coverage needs at least {found.group(2)} pieces (4 special, 256 byte "
            "pieces and one per distinct character)") from e
    return model.getvalue()
