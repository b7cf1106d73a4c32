"""Default: a small Transformer translating numbers from German words to English words.

The built-in "numbers" dataset needs no download: German puts units before tens
("einundzwanzig" = "twenty-one"), so the model must learn to reorder.

    python -m transformer_jax.data --config=configs/default.py --split=validation --show=5

Hardware: a 2-core CPU is enough.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # fixes initialisation, data order and dropout

    # The architecture: the fields of transformer_jax.ModelConfig, starting from a
    # preset; vocab_size comes from the trained tokenizer.
    config.model = ml_collections.ConfigDict()
    config.model.preset = "tiny"  # "tiny", "base" or "big" (Table 3)
    config.model.d_model = 128
    config.model.d_ff = 512
    config.model.num_heads = 4
    config.model.num_layers = 3
    config.model.dropout_rate = 0.1
    config.model.max_length = 64  # only used by positional_encoding="learned"

    config.data = ml_collections.ConfigDict()
    config.data.dataset = "numbers"  # "numbers", "tfds:NAME" or "folder:PATH"
    config.data.numbers_size = "full"  # "full" (200k/2k/2k pairs) or "small" (4k/200/200)
    config.data.source_lang = "de"
    config.data.target_lang = "en"
    config.data.data_dir = ml_collections.config_dict.placeholder(str)  # None: TFDS's default
    config.data.download = True  # may TFDS download a dataset that is not prepared
    config.data.vocab_size = 512  # shared source/target SentencePiece vocabulary
    config.data.tokenizer_type = "bpe"  # "bpe" as in the paper (§5.1), or "unigram"
    config.data.tokenizer_sentences = 1_000_000  # at most this many sentences train it
    config.data.max_source_length = 32  # tokens per packed row, EOS included
    config.data.max_target_length = 32
    config.data.too_long = "truncate"  # pairs longer than a row: "truncate" or "drop"
    config.data.num_threads = 2  # grain reader threads
    return config
