#!/usr/bin/env bash
# Install Python's safetensors and tokenizers (pinned with their hashes in scripts/python-test-wheels.txt) into the project-local
# folder .deps/python, for Debian's python3 (/usr/bin/python3, whose python3-torch scripts/setup.sh installs).
# The tests put the folder on PYTHONPATH (tests/CMakeLists.txt); nothing is installed system-wide. The wheel is
# cached in .deps/wheels. Idempotent: does nothing when the folder holds what the pinned wheel installs. Needs
# python3-pip and, the first time, network access to PyPI. PYTHON=... picks another interpreter.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PINS="$ROOT/scripts/python-test-wheels.txt"
WHEELS="$ROOT/.deps/wheels"
PREFIX="$ROOT/.deps/python"
STAMP="$PREFIX/.installed-from"
PY=${PYTHON:-/usr/bin/python3}
fail() { echo "install-python-test-deps: $*" >&2; exit 1; }

want_stamp=$(grep -E '^[a-z]' "$PINS")
[ -n "$want_stamp" ] || fail "no pinned wheel in $PINS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] &&
   PYTHONPATH="$PREFIX" "$PY" -c 'import safetensors.torch, tokenizers' 2>/dev/null; then
  exit 0  # already installed from these wheels
fi
"$PY" -m pip --version >/dev/null 2>&1 ||
  fail "$PY has no pip; install Debian's python3-pip (scripts/setup.sh does) and rerun"
echo "mixprec setup: installing Python's safetensors and tokenizers into .deps/python (interchange and parity tests)"
mkdir -p "$WHEELS"
"$PY" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes -r "$PINS" \
  -d "$WHEELS" >/dev/null ||
  fail "pip could not download the wheels pinned in $PINS for $PY (network access to PyPI is needed once)"
tmp="$PREFIX.tmp"
rm -rf "$tmp"
# --no-index --find-links: only the cached, hash-checked wheels; --target: a folder of our own, not the system's.
"$PY" -m pip install --disable-pip-version-check --no-index --find-links "$WHEELS" --no-deps --no-compile \
  --require-hashes -r "$PINS" --target "$tmp" >"$ROOT/.deps/pip-install-python.log" 2>&1 ||
  { cat "$ROOT/.deps/pip-install-python.log" >&2; fail "pip install of $PINS into $tmp failed"; }
PYTHONPATH="$tmp" "$PY" -c 'import safetensors.torch, tokenizers' ||
  fail "safetensors.torch does not import with $PY (is Debian's python3-torch installed? scripts/setup.sh installs it)"
printf '%s\n' "$want_stamp" >"$tmp/.installed-from"
rm -rf "$PREFIX"
mv "$tmp" "$PREFIX"
