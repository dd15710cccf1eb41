#!/usr/bin/env bash
# Prints the path of a Python 3.12 interpreter, the version this project's environment is built with (megatron-core
# >= 0.17 requires Python >= 3.12; torch 2.13, megatron-core 0.19.2 and megatron-fsdp 0.6.1 are tested on 3.12).
# Looks where a user's machine has one: $PYTHON if set (then nothing else), python3.12 and python3 on PATH, then
# pyenv's versions ($(pyenv root) or ~/.pyenv), then uv's managed Pythons. Each candidate is run, so a pyenv shim
# that exists but is not active for this directory is skipped. Exits 1 with a message naming the fix if none works.
set -uo pipefail

WANT=${PY_VERSION:-3.12}
WANT_MAJOR=${WANT%%.*}
WANT_MINOR=${WANT#*.}

is_wanted() {
  "$1" -c "import sys; sys.exit(sys.version_info[:2] != ($WANT_MAJOR, $WANT_MINOR))" >/dev/null 2>&1
}

resolve() {
  "$1" -c "import sys; print(sys.executable)" 2>/dev/null
}

if [ -n "${PYTHON:-}" ]; then
  if is_wanted "$PYTHON"; then resolve "$PYTHON"; exit 0; fi
  echo "error: PYTHON=$PYTHON is not a working Python $WANT_MAJOR.$WANT_MINOR interpreter;" \
       "unset PYTHON or point it at one (e.g. PYTHON=/usr/bin/python$WANT_MAJOR.$WANT_MINOR)." >&2
  exit 1
fi

candidates=("python$WANT_MAJOR.$WANT_MINOR" "python$WANT_MAJOR")
pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for p in "$pyenv_root"/versions/"$WANT_MAJOR.$WANT_MINOR".*/bin/python; do
  [ -x "$p" ] && candidates+=("$p")
done
if command -v uv >/dev/null 2>&1; then
  p=$(uv python find "$WANT_MAJOR.$WANT_MINOR" 2>/dev/null) && candidates+=("$p")
fi

for c in "${candidates[@]}"; do
  if is_wanted "$c"; then resolve "$c"; exit 0; fi
done

echo "error: no Python $WANT_MAJOR.$WANT_MINOR found (tried python$WANT_MAJOR.$WANT_MINOR and python$WANT_MAJOR on PATH," \
     "$pyenv_root/versions/$WANT_MAJOR.$WANT_MINOR.*, uv). Install one (e.g. 'pyenv install $WANT_MAJOR.$WANT_MINOR'," \
     "'uv python install $WANT_MAJOR.$WANT_MINOR' or your OS package python$WANT_MAJOR.$WANT_MINOR-venv)," \
     "or run make with PYTHON=/path/to/python$WANT_MAJOR.$WANT_MINOR." >&2
exit 1
