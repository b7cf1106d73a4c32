"""The run's tokenizer: trained once on the training split, then reused from the workdir."""

import itertools
import os

import grain

from transformer_jax.data.sources import open_split
from transformer_jax.data.tokenizer import Tokenizer, load_or_train_tokenizer

TOKENIZER_FILE = "tokenizer.model"


def tokenizer_path(workdir: str) -> str:
    return os.path.join(workdir, TOKENIZER_FILE)


def training_sentences(data_config, max_sentences: int):
    """Up to `max_sentences` sentences, both sides, from an evenly spread share of train."""
    pairs = open_split(data_config, "train")
    step = max(1, (2 * len(pairs)) // max(max_sentences, 1))
    sample = pairs[::step].to_iter_dataset(
        grain.ReadOptions(num_threads=data_config.num_threads, prefetch_buffer_size=512))
    sides = ((pair["source"], pair["target"]) for pair in sample)
    return itertools.islice(itertools.chain.from_iterable(sides), max_sentences)


def get_tokenizer(data_config, workdir: str) -> Tokenizer:
    """The tokenizer saved in `workdir`, or a new one trained on the training split."""
    return load_or_train_tokenizer(
        tokenizer_path(workdir),
        lambda: training_sentences(data_config, data_config.tokenizer_sentences),
        data_config.vocab_size,
        model_type=data_config.tokenizer_type,
    )
