"""train.py, with process 0's data preparation starting SECONDS late, or failing:
`python tests/train_prepare_fault.py (SECONDS | fail) --config=... [train.py's flags]`.
"""

import pathlib
import runpy
import sys
import time

import jax

from transformer_jax import trainer
from transformer_jax.data import DataError

fault = sys.argv.pop(1)
prepare = trainer.prepare


def faulty_prepare(*args, **kwargs):
    if jax.process_index() == 0:
        if fault == "fail":
            raise DataError("corpus.tsv has no pairs")
        time.sleep(float(fault))
    return prepare(*args, **kwargs)


trainer.prepare = faulty_prepare
sys.argv[0] = str(pathlib.Path(__file__).resolve().parents[1] / "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
