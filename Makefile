# Two commands do all set-up on a fresh machine:
#   make pretrain   # trains the tiny Llama on the shipped corpus (2 CPU processes), writes checkpoints + TensorBoard
#   make test       # runs the unit and functional test suites
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements/cpu.txt pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv pretrain test lint clean-runs

$(STAMP): requirements/cpu.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements/cpu.txt -e ".[test,perf]"
	rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

pretrain: $(STAMP)
	$(PY) scripts/training/run_recipe.py --recipe tiny_llama --nproc 2 --corpus --dir runs/tiny_llama \
		train.train_iters=600 train.exit_interval=300

test: $(STAMP)
	$(PY) -m ruff check src tests scripts
	$(PY) -m pytest tests

lint: $(STAMP)
	$(PY) -m ruff check src tests scripts
