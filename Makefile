# The two entry points of the README. Each works on a fresh machine with python3, pip and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed
STAMP := $(VENV)/.installed-dev

.PHONY: train test clean

# Create the virtual environment once, with the package and what the README's walk-through
# uses after training (the notebooks' and the export's packages); reinstall when
# pyproject.toml changes.
# -qq: errors only (setuptools' notice on every editable install is not one).
$(BASE): pyproject.toml
	@echo "setting up $(VENV): the package and its dependencies (a minute or more the first time)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq --editable '.[notebooks,serve]'
	touch $(BASE)

# The suite's: the dev extra (pytest, ruff, and the benchmark's PyTorch peer), which holds
# the notebooks' and the export's extras too, so one install serves make train as well.
$(STAMP): pyproject.toml
	@echo "setting up $(VENV) with the test suite's packages (a minute or more the first time)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq --editable '.[dev]'
	touch $(BASE) $(STAMP)

train: $(BASE)
	$(BIN)/python train.py --config=configs/default.py --workdir=runs/default

# --dist loadgroup: the tests of an xdist_group run in one worker, so that their module's
# fixtures (an export, the multi-process runs) are made once, not once in each worker.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

clean:
	rm -rf $(VENV) .pytest_cache
