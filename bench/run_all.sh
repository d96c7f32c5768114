#!/usr/bin/env bash
# Run the CPU benchmarks and print their markdown tables (paste into bench/RESULTS.md with the
# machine, date and commit printed at the top).
set -euo pipefail
build=${1:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "date: $(date -u +%Y-%m-%d)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo
"$build/bench/bench_matmul_conv"
echo
"$build/bench/bench_elementwise"
for b in "$build"/bench/bench_*; do
  case "$(basename "$b")" in bench_matmul_conv|bench_elementwise) ;; *) echo; "$b";; esac
done
