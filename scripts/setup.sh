#!/usr/bin/env bash
# Install what mixprec needs: Debian packages, then oneDNN 3.2 from PyPI into .deps/onednn
# (scripts/install-onednn.sh) and the tests' Python safetensors into .deps/python
# (scripts/install-python-test-deps.sh). Idempotent: skips what is already present.
set -euo pipefail
# --bench adds what the side-by-side benchmarks need: Debian's PyTorch and OpenBLAS (without it,
# Debian's torch runs its f32 matmuls on the reference libblas3, ~50x slower: a straw man).
# python3-pip: installs the oneDNN wheels (Debian 12 ships oneDNN 2.6 only; mixprec uses 3.2) and Python's
# safetensors. python3-torch: Debian's PyTorch 1.13 (CPU), the other side of the PyTorch interchange tests
# (tests/python/interop.py) and the benchmarks' extra column; not PyPI's torch, whose CUDA wheels are gigabytes.
# libpcre2-dev: GPT-2's pre-tokenization regex of the BPE tokenizer (src/data/pretokenize.cpp).
pkgs=(build-essential cmake python3-pip libgtest-dev libbenchmark-dev zlib1g-dev libcli11-dev
      nlohmann-json3-dev libfmt-dev dataset-fashion-mnist bible-kjv gnuplot-nox libopenmpi-dev openmpi-bin
      python3-torch libpcre2-dev pkg-config)
if [ "${1:-}" = "--bench" ]; then
  # python3-venv: scripts/setup-bench-venv.sh (run last) makes .venv-bench/ with PyPI's newest torch, the
  # PyTorch that bench/compare_pytorch.sh compares with; Debian's python3-torch 1.13 is its extra column.
  pkgs+=(libopenblas0-openmp python3-venv)
elif [ "${1:-}" = "--fuzz" ]; then
  # `make fuzz`: clang and its runtimes (libFuzzer, ASan, UBSan); fuzz/CMakeLists.txt.
  pkgs+=(clang-14 libclang-rt-14-dev)
elif [ -n "${1:-}" ]; then
  echo "setup.sh: unknown option '$1'; expected nothing, --bench or --fuzz" >&2
  exit 2
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "mixprec setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
"$(dirname "$0")/install-onednn.sh"
"$(dirname "$0")/install-python-test-deps.sh"  # Python's safetensors into .deps/python
if [ "${1:-}" = "--bench" ]; then
  "$(dirname "$0")/setup-bench-venv.sh"
fi
