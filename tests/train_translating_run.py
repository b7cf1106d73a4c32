"""run_configs.translating_run() trained for conftest.py's `translating_run`, in a process of
its own: `python tests/train_translating_run.py WORKDIR SUMMARY` (SUMMARY: a JSON file of
run_configs.train_counting_fetches)."""

import json
import pathlib
import sys

from run_configs import train_counting_fetches, translating_run

workdir, summary = map(pathlib.Path, sys.argv[1:])
summary.write_text(json.dumps(train_counting_fetches(translating_run(), workdir)))
