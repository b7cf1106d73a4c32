"""Data: sources, tokenizer, prepared token ids, batches.

    tokenizer, splits = prepare(config.data, workdir)   # train and validation as ids, once
    batches = train_dataset(splits["train"], batch_size=64, max_source_length=32,
                            max_target_length=32)    # packed rows, grain IterDataset
    batches = bucketed_dataset(splits["train"], tokens_per_batch=25_000,
                               max_source_length=256, max_target_length=256)   # §5.1's way
    pairs = load_split(config.data, "validation").pairs   # text: {"source": str, "target": str}

Each name is imported from its module on first use (`__init__.pyi` lists them), so the
processes that tokenize a corpus import the tokenizer without grain or JAX.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
