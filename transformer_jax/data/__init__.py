"""Data: sources, tokenizer, batches.

    train = load_split(config.data, "train")             # .pairs: {"source": str, "target": str}
    tokenizer = get_tokenizer(config.data, workdir)      # SentencePiece, shared vocabulary
    batches = train_dataset(train.pairs, tokenizer, batch_size=64, max_source_length=32,
                            max_target_length=32)        # packed rows, grain IterDataset
"""

from transformer_jax.data.pipeline import Tokenize, eval_batches, train_dataset
from transformer_jax.data.sources import DataError, Split, load_split, translation_datasets
from transformer_jax.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    train_tokenizer,
)
from transformer_jax.data.vocabulary import get_tokenizer, tokenizer_path
