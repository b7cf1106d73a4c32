"""Data: sources, tokenizer, prepared token ids, batches.

    tokenizer, splits = prepare(config.data, workdir)   # train and validation as ids, once
    batches = train_dataset(splits["train"], batch_size=64, max_source_length=32,
                            max_target_length=32)    # packed rows, grain IterDataset
    batches = bucketed_dataset(splits["train"], tokens_per_batch=25_000,
                               max_source_length=256, max_target_length=256)   # §5.1's way
    pairs = load_split(config.data, "validation").pairs   # text: {"source": str, "target": str}
"""

from transformer_jax.data.bucketing import bucketed_dataset
from transformer_jax.data.pipeline import budget_rows, eval_batches, train_dataset
from transformer_jax.data.prepared import PreparedSplit, open_split, prepare, prepared_dir
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
