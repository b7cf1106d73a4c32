"""Building blocks of the run configs in configs/: each group with its defaults and meanings.

A config file is Python returning a locked `ml_collections.ConfigDict`; it starts
from these groups and overrides what its setup needs, so every run accepts the
same keys on the command line (`--config.data.vocab_size=8000`).
"""

import dataclasses

import ml_collections

from transformer_jax.model_config import ModelConfig, get_model_config


def model_fields(preset: str, **overrides) -> ml_collections.ConfigDict:
    """Every field of `ModelConfig` (see there), from a preset, except vocab_size.

    vocab_size is the trained tokenizer's size (`config.data.vocab_size` asks for it).
    """
    fields = dataclasses.asdict(get_model_config(preset, **overrides))
    del fields["vocab_size"]
    return ml_collections.ConfigDict(fields)


def build_model_config(model_group, vocab_size: int) -> ModelConfig:
    """The frozen `ModelConfig` of a run: its model group plus the tokenizer's size."""
    return ModelConfig(**model_group.to_dict(), vocab_size=vocab_size)


def data_fields(**overrides) -> ml_collections.ConfigDict:
    """The data group: where pairs come from, the tokenizer, and the rows they are packed in."""
    data = ml_collections.ConfigDict()
    data.dataset = "numbers"  # "numbers", "tfds:NAME" or "folder:PATH"
    data.numbers_size = "full"  # "numbers" only: "full" (200k/2k/2k pairs) or "small" (4k/200/200)
    data.source_lang = "de"
    data.target_lang = "en"
    data.data_dir = ml_collections.config_dict.placeholder(str)  # TFDS data dir; None: its default
    data.download = True  # may TFDS download and prepare a dataset that is not prepared
    data.vocab_size = 512  # shared source/target SentencePiece vocabulary (§5.1)
    data.tokenizer_type = "bpe"  # "bpe" as in the paper, or "unigram"
    data.tokenizer_sentences = 1_000_000  # at most this many sentences train the tokenizer
    data.max_source_length = 32  # tokens per packed row, EOS included
    data.max_target_length = 32
    data.too_long = "truncate"  # pairs longer than a row: "truncate" or "drop"
    data.num_threads = 2  # grain threads that read and tokenize
    data.lock().update(overrides)  # locked: a misspelt key is an error, not a new field
    return data.unlock()
