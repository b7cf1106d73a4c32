"""Your own parallel corpus: a folder of {split}.{lang} files, UTF-8, aligned line by line.

    corpus/train.de  corpus/train.en  corpus/validation.de  corpus/validation.en  (test.* too)

    python train.py --config=configs/local_text.py --config.data.dataset=folder:corpus \
        --workdir=runs/corpus

A moderate model (6 layers of width 256) with a 16k shared BPE vocabulary: for a
corpus of some hundred thousand pairs on one GPU. Set the languages with
--config.data.source_lang / --config.data.target_lang.
"""

from ml_collections import ConfigDict

from transformer_jax.run_config import base_config, data_fields, model_fields


def get_config() -> ConfigDict:
    config = base_config(
        model=model_fields("base", d_model=256, d_ff=1024, num_heads=4),
        data=data_fields(
            dataset="folder:corpus",  # replace with folder:PATH of your corpus
            source_lang="de", target_lang="en",
            vocab_size=16_000,
            max_source_length=64, max_target_length=64,
        ),
    )
    config.num_train_steps = 50_000
    config.per_device_batch_size = 128  # 128 rows of 64 tokens: about 8k target tokens
    return config
