"""Default: a small Transformer translating numbers from German words to English words.

The built-in "numbers" dataset needs no download. German puts units before tens
("einundzwanzig" = "twenty-one") and writes a number as one word, so the model
must learn to split and reorder.

    python -m transformer_jax.data --config=configs/default.py --split=validation --show=5

Hardware: a 2-core CPU is enough.
"""

from ml_collections import ConfigDict

from transformer_jax.run_config import data_fields, model_fields


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0  # fixes initialisation, data order and dropout
    # Smaller than "base" (Table 3): 3 layers of width 128 learn this task on a CPU.
    config.model = model_fields("tiny", d_model=128, d_ff=512, num_heads=4, num_layers=3,
                                max_length=64)
    config.data = data_fields(
        dataset="numbers", source_lang="de", target_lang="en",
        vocab_size=512,  # German number words split into a few hundred pieces
        max_source_length=16,  # German sources are about half as long as the English
        max_target_length=32,
    )
    return config
