# The two entry points of the README. Each works on a fresh machine with python3, pip and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: train test clean

# Create the virtual environment once; reinstall when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --editable '.[dev]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python train.py --config=configs/default.py --workdir=runs/default

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(VENV) .pytest_cache
