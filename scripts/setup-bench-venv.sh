#!/usr/bin/env bash
# Make the benchmarks' project-local Python environment .venv-bench/ with PyPI's newest torch and numpy
# (the PyTorch that bench/compare_pytorch.sh compares mixprec with). Idempotent: does nothing when the
# environment already imports torch and numpy. `scripts/setup.sh --bench` runs it after apt.
#
#   scripts/setup-bench-venv.sh            # create / complete .venv-bench/
#   scripts/setup-bench-venv.sh --upgrade  # also move an existing one to PyPI's newest torch and numpy
#
# The environment is made by `python3 -m venv` from Debian's /usr/bin/python3 (package python3-venv;
# PYTHON=... picks another interpreter). torch's Linux wheel pulls NVIDIA's CUDA wheels too (several GB);
# the benchmarks use it on the CPU. MIXPREC_BENCH_VENV=DIR puts the environment elsewhere.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MIXPREC_BENCH_VENV:-$ROOT/.venv-bench}
UPGRADE=0
case "${1:-}" in
  "") ;;
  --upgrade) UPGRADE=1 ;;
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup-bench-venv.sh: unknown option '$1'; expected nothing or --upgrade" >&2; exit 2 ;;
esac

VPY="$VENV/bin/python"
if [[ $UPGRADE == 0 && -x "$VPY" ]] && "$VPY" -c 'import torch, numpy' 2>/dev/null; then
  echo "mixprec bench venv: $VENV has torch $("$VPY" -c 'import torch; print(torch.__version__)') (--upgrade for PyPI's newest)"
  exit 0
fi

if [[ -n "${PYTHON:-}" ]]; then
  BASE=$PYTHON
elif [[ -x /usr/bin/python3 ]]; then
  BASE=/usr/bin/python3
else
  BASE=$(command -v python3 || true)
fi
[[ -n "$BASE" ]] || { echo "setup-bench-venv.sh: no python3 found (apt-get install python3 python3-venv)" >&2; exit 2; }

# A half-made environment (e.g. `python3 -m venv` without ensurepip leaves one with no pip) is made anew.
if [[ -x "$VPY" ]] && ! "$VPY" -m pip --version >/dev/null 2>&1; then
  echo "mixprec bench venv: $VENV has no working pip; making it anew"
  rm -rf -- "${VENV:?}"
fi
if [[ ! -x "$VPY" ]]; then
  echo "mixprec bench venv: creating $VENV with $BASE ($("$BASE" --version 2>&1))"
  if ! "$BASE" -m venv "$VENV"; then
    rm -rf -- "${VENV:?}"
    echo "setup-bench-venv.sh: '$BASE -m venv' failed; on Debian install python3-venv (scripts/setup.sh --bench does)" >&2
    exit 1
  fi
fi

echo "mixprec bench venv: installing PyPI's newest torch and numpy into $VENV (torch pulls its CUDA wheels: several GB)"
"$VPY" -m pip install --upgrade --progress-bar off torch numpy
"$VPY" -c 'import numpy, torch; print("mixprec bench venv: torch %s, numpy %s, in %s" % (torch.__version__, numpy.__version__, __import__("sys").prefix))'
