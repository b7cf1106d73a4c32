"""The run's tokenizer: trained once on the training split, then reused from the workdir."""

import itertools
import os

from transformer_jax.data.sources import DataError, load_split
from transformer_jax.data.tokenizer import Tokenizer, load_or_train_tokenizer

TOKENIZER_FILE = "tokenizer.model"


def tokenizer_path(workdir: str) -> str:
    return os.path.join(workdir, TOKENIZER_FILE)


def training_sentences(pairs, max_sentences: int):
    """Up to `max_sentences` sentences, both sides, from pairs spread evenly over `pairs`."""
    step = max(1, (2 * len(pairs)) // max(max_sentences, 1))
    sides = ((pair["source"], pair["target"]) for pair in pairs[::step])
    return itertools.islice(itertools.chain.from_iterable(sides), max_sentences)


def get_tokenizer(data_config, workdir: str, train_pairs=None) -> Tokenizer:
    """The tokenizer saved in `workdir`, or a new one trained on the training split.

    `train_pairs`: the whole training split if already loaded (else it is read).
    """

    def sentences():
        pairs = train_pairs if train_pairs is not None else load_split(data_config, "train").pairs
        return training_sentences(pairs, data_config.tokenizer_sentences)

    try:
        return load_or_train_tokenizer(
            tokenizer_path(workdir),
            sentences,
            data_config.vocab_size,
            model_type=data_config.tokenizer_type,
        )
    except ValueError as error:  # settings the user chose: say which ones
        if isinstance(error, DataError):
            raise
        raise DataError(f"tokenizer (config.data.vocab_size={data_config.vocab_size}, "
                        f"tokenizer_type={data_config.tokenizer_type!r}): {error}") from None
