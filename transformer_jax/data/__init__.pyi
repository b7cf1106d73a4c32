# What `transformer_jax.data` gives; __init__.py imports each name on first use.

from .bucketing import bucketed_dataset
from .pipeline import budget_rows, eval_batches, train_dataset
from .prepared import PreparedSplit, open_split, prepare, prepared_dir
from .sources import DataError, Split, load_split, translation_datasets
from .tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    train_tokenizer,
)
from .vocabulary import get_tokenizer, tokenizer_path
