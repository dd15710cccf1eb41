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
NOT_COMPILED := /(tests?|pip|fontTools|pygments)/|/transformers/models/(?!auto/)
STAMP := $(VENV)/.installed-py$(PY_VERSION)-$(shell cat requirements/cpu.txt pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv pretrain test lint clean-runs

$(STAMP): requirements/cpu.txt pyproject.toml
	@if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$(PY_VERSION)".split("."))))' \
			2>/dev/null; then \
		py=$$(PYTHON="$(PYTHON)" PY_VERSION=$(PY_VERSION) scripts/env/find_python.sh) || exit 1; \
		if [ -e $(VENV) ]; then echo "$(VENV) is not a Python $(PY_VERSION) environment: recreating it"; fi; \
		rm -rf $(VENV); echo "creating $(VENV) with $$py"; "$$py" -m venv $(VENV); \
	fi
	@# uv installs the pinned set (same versions as pip) in ~20 s instead of pip's ~70 s, downloads included (it
	@# fetches and unpacks the wheels in parallel); pip itself is the fallback. --system-certs: the OS's certificates,
	@# as pip is configured here.
	$(PY) -m pip install -q -c requirements/cpu.txt uv
	$(VENV)/bin/uv pip install -q --python $(PY) --system-certs -c requirements/cpu.txt -e ".[test,perf]" || \
		{ echo "uv failed: installing with pip"; $(PY) -m pip install -q --no-compile -c requirements/cpu.txt -e ".[test,perf]"; }
	@# Bytecode on every core (pip compiles one file at a time), but not of what is never imported here: tests, pip,
	@# fonts, lexers, and the ~300 model folders of transformers (auto/ stays; a model's files compile at first import).
	@# 14,300 -> 8,750 files, 41 -> ~25 s. A file that does not compile (a template, another Python's syntax) is read
	@# from source, as pip leaves it.
	PYTHONWARNINGS=ignore::SyntaxWarning $(PY) -m compileall -qq -j 0 -x '$(NOT_COMPILED)' $(VENV)/lib || true
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
