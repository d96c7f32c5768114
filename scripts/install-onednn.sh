#!/usr/bin/env bash
# Install oneDNN 3.2 (PyPI's onednn-cpu-gomp + onednn-devel-cpu-gomp 2023.2.0, pinned with their hashes in
# scripts/onednn-wheels.txt) into the project-local prefix .deps/onednn, where CMakeLists.txt looks first.
# The wheels are cached in .deps/wheels. Idempotent: does nothing when the prefix holds what the pinned
# wheels install. Called by scripts/setup.sh; needs python3 with pip (Debian: python3-pip) and, the first
# time, network access to PyPI.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PINS="$ROOT/scripts/onednn-wheels.txt"
WHEELS="$ROOT/.deps/wheels"
PREFIX="$ROOT/.deps/onednn"
STAMP="$PREFIX/.installed-from"
fail() { echo "install-onednn: $*" >&2; exit 1; }

# name==version and sha256 of each pinned wheel.
mapfile -t pins < <(grep -E '^[a-z]' "$PINS")
[ ${#pins[@]} -eq 2 ] || fail "expected 2 pinned wheels in $PINS, found ${#pins[@]}"
want_stamp=$(printf '%s\n' "${pins[@]}")
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] && [ -f "$PREFIX/lib/libdnnl.so.3" ] &&
   [ -f "$PREFIX/lib/cmake/dnnl/dnnl-config.cmake" ]; then
  exit 0  # already installed from these wheels
fi

PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -m pip --version >/dev/null 2>&1; then PY=$p; break; fi
done
[ -n "$PY" ] || fail "no python3 with pip found; install Debian's python3-pip (scripts/setup.sh does) and rerun"

# The wheel files of the pins (pip's file names: dashes become underscores).
wheel_file() {  # pin line -> path of its wheel in $WHEELS, or nothing
  local spec=${1%% *} name ver
  name=${spec%%==*}; ver=${spec##*==}
  compgen -G "$WHEELS/${name//-/_}-${ver}-*.whl" | head -n 1 || true
}
hash_ok() {  # pin line, file
  local want=${1##*sha256:}
  [ -n "$2" ] && [ "$(sha256sum "$2" | cut -d' ' -f1)" = "$want" ]
}
need_download=0
for pin in "${pins[@]}"; do hash_ok "$pin" "$(wheel_file "$pin")" || need_download=1; done
if [ "$need_download" = 1 ]; then
  echo "mixprec setup: downloading oneDNN 3.2 wheels from PyPI into .deps/wheels"
  mkdir -p "$WHEELS"
  "$PY" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    --require-hashes -r "$PINS" -d "$WHEELS" ||
    fail "pip could not download the wheels pinned in $PINS (network access to PyPI is needed once; or copy them into $WHEELS)"
fi
files=()
for pin in "${pins[@]}"; do
  f=$(wheel_file "$pin")
  hash_ok "$pin" "$f" || fail "the wheel for '${pin%% *}' in $WHEELS is missing or does not have the pinned sha256; delete it and rerun"
  files+=("$f")
done

echo "mixprec setup: installing oneDNN 3.2 into .deps/onednn"
tmp="$PREFIX.tmp"
rm -rf "$tmp"
"$PY" -m pip install --disable-pip-version-check --no-index --no-deps --no-compile --prefix "$tmp" "${files[@]}" \
  >"$ROOT/.deps/pip-install.log" 2>&1 || { cat "$ROOT/.deps/pip-install.log" >&2; fail "pip install of ${files[*]} into $tmp failed"; }
# The wheel holds libdnnl.so, .so.3 and .so.3.2 as three copies of the same 54 MB file: keep one.
lib="$tmp/lib"
[ -f "$lib/libdnnl.so.3.2" ] || fail "the wheel did not install $lib/libdnnl.so.3.2 (see .deps/pip-install.log)"
ln -sf libdnnl.so.3.2 "$lib/libdnnl.so.3"
ln -sf libdnnl.so.3 "$lib/libdnnl.so"
[ -f "$tmp/lib/cmake/dnnl/dnnl-config.cmake" ] || fail "the devel wheel did not install lib/cmake/dnnl/dnnl-config.cmake"
printf '%s\n' "$want_stamp" >"$tmp/.installed-from"
rm -rf "$PREFIX"
mv "$tmp" "$PREFIX"
echo "mixprec setup: oneDNN 3.2 is in .deps/onednn ($(du -sh "$PREFIX" | cut -f1))"
