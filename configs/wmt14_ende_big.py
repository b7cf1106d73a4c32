"""The paper's big model on WMT 2014 English -> German (Table 3 "big", §5).

    python train.py --config=configs/wmt14_ende_big.py --workdir=runs/wmt14_big

Hardware: meant for 8 accelerators (the paper: 8 P100 GPUs, about 1.0 s per step, 300k
steps in 3.5 days); the same 25k-token updates as the base config (see there for fewer
devices). Expected result: the paper reports 28.4 BLEU on newstest2014 (tokenized and
compound-split). Not yet reproduced with this code.
"""

import pathlib

from ml_collections import ConfigDict

from transformer_jax.command_line import load_config_file
from transformer_jax.run_config import model_fields

# The base recipe beside this file, found by its path: `from configs import ...` worked only
# where the repository root is on sys.path (train.py's folder), not from a notebook elsewhere.
BASE = pathlib.Path(__file__).with_name("wmt14_ende_base.py")


def get_config() -> ConfigDict:
    config = load_config_file(str(BASE), "wmt14_ende_base")
    config.model = model_fields("big")  # d_model 1024, d_ff 4096, h 16, P_drop 0.3 (EN-DE)
    config.num_train_steps = 300_000
    # §6.1: the big model averages the last 20 checkpoints, written every 10 minutes
    # (600 steps at the paper's 1.0 s per step).
    config.checkpoint_every_steps = 600
    config.checkpoints_to_keep = 20
    return config
