# Two commands do all set-up on a fresh machine:
#   make pretrain   # trains the tiny Llama on the shipped corpus (2 CPU processes), writes checkpoints + TensorBoard
#   make test       # runs the unit and functional test suites
# The environment is Python 3.12 (megatron-core >= 0.17 requires it). scripts/env/find_python.sh finds the
# interpreter: PYTHON if given (make PYTHON=/path/to/python3.12), else python3.12/python3 on PATH, else pyenv's or
# uv's 3.12; it names the fix when there is none. A .venv made by another Python version is recreated.
PYTHON ?=
PY_VERSION := 3.12
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-py$(PY_VERSION)-$(shell cat requirements/cpu.txt pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv pretrain test lint clean-runs

$(STAMP): requirements/cpu.txt pyproject.toml
	@if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$(PY_VERSION)".split("."))))' \
			2>/dev/null; then \
		py=$$(PYTHON="$(PYTHON)" PY_VERSION=$(PY_VERSION) scripts/env/find_python.sh) || exit 1; \
		if [ -e $(VENV) ]; then echo "$(VENV) is not a Python $(PY_VERSION) environment: recreating it"; fi; \
		rm -rf $(VENV); echo "creating $(VENV) with $$py"; "$$py" -m venv $(VENV); \
	fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -c requirements/cpu.txt -e ".[test,perf]"
	@# pip compiles the bytecode one file at a time; compileall uses every core (84 s -> 74 s for make venv on 2 cores).
	@# Like pip, it leaves a file that does not compile (a template, another Python's syntax) to be read from source.
	PYTHONWARNINGS=ignore::SyntaxWarning $(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

pretrain: $(STAMP)
	$(PY) scripts/training/run_recipe.py --recipe tiny_llama --nproc 2 --corpus --dir runs/tiny_llama \
		train.train_iters=600 train.exit_interval=300

test: $(STAMP)
	$(PY) -m ruff check src tests scripts
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest tests -n 3 --dist loadgroup

lint: $(STAMP)
	$(PY) -m ruff check src tests scripts
