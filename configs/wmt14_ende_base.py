"""The paper's base model on WMT 2014 English -> German (Table 3 "base", §5).

    python train.py --config=configs/wmt14_ende_base.py --workdir=runs/wmt14_base

Hardware: meant for 8 accelerators (the paper: 8 P100 GPUs, about 0.4 s per step, 100k
steps in 12 hours). Each update holds at most 25,000 source and 25,000 target tokens, as
in §5.1 (`data.tokens_per_batch`), whatever the number of devices: 8 devices pack 12 rows
of 256 tokens each (96 rows); one H100 takes all 97 rows at once in bfloat16 (38.9 ms per
step at 96 rows on 2026-11-27, the README's table and docs/gpu.md),
    --config.model.dtype=bfloat16
and a smaller GPU splits them into micro-batches with --config.accumulation_steps=N.
--config.model.dtype=bfloat16 computes in bfloat16 (parameters stay float32). The paper
batched pairs of similar length instead of packing them: --config.data.batching=bucketed.

Data: TFDS prepares wmt14_translate/de-en on first use (a download of several GB; about
4.5M pairs); validation is newstest2013. Expected result: the paper reports 27.3 BLEU on
newstest2014 (tokenized and compound-split; sacreBLEU runs lower). Not yet reproduced
with this code.
"""

from ml_collections import ConfigDict

from transformer_jax.run_config import base_config, data_fields, model_fields, optim_fields


def get_config() -> ConfigDict:
    config = base_config(
        model=model_fields("base"),  # N 6, d_model 512, d_ff 2048, h 8, P_drop 0.1
        data=data_fields(
            dataset="tfds:wmt14_translate/de-en", source_lang="en", target_lang="de",
            vocab_size=37_000,  # shared source-target BPE vocabulary (§5.1)
            max_source_length=256, max_target_length=256,
        ),
        optim=optim_fields(warmup_steps=4000, label_smoothing=0.1),  # §5.3, §5.4
    )
    config.num_train_steps = 100_000
    config.per_device_batch_size = 0  # rows from the token budget:
    config.data.tokens_per_batch = 25_000  # per update and side (§5.1), over all devices
    config.log_every_steps = 100
    config.eval_every_steps = 2000
    # §6.1: the base model averages the last 5 checkpoints, written every 10 minutes
    # (1500 steps at the paper's 0.4 s per step).
    config.checkpoint_every_steps = 1500
    config.checkpoints_to_keep = 5
    return config
