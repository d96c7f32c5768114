#!/usr/bin/env bash
# Issue 4's accuracy benchmark: ResNet-18 (CIFAR-style stem) on Fashion-MNIST, one `mixprec train` per
# precision with the same recipe, then the table for bench/RESULTS.md.
#
#   bench/accuracy_resnet18.sh BUILD_DIR OUT_DIR [PRECISION ...]   # default precisions: fp32 bf16
#   bench/accuracy_resnet18.sh --table OUT_DIR [PRECISION ...]       # only the table of (partial) runs
#
# Recipe: 15 epochs, batch 128, SGD 0.1 momentum 0.9 weight decay 5e-4, 1 epoch of linear warm-up, then
# cosine; random crop (padding 2 on 28x28 images, 4 on 32x32) and horizontal flip; test accuracy on the
# 10,000 test images after every epoch. Environment: EPOCHS (default 15), THREADS (per run, default 1), DEVICE (default cpu; cuda
# runs the same recipe on a GPU; not tried on one yet).
#
# The runs are long on a CPU (2-core Sapphire Rapids, one thread each: bf16 ~12 min, fp32 ~34 min per
# epoch with AMX; without AMX both ~23 min, bf16 computing through f32 there: bench/RESULTS.md), so they
# run side by side, one thread each (on two cores this beats running them one after the
# other with two threads: OpenMP barriers make a 2-thread run stall whenever anything else holds a
# core), checkpoint every 100 steps, and the script resumes each from OUT_DIR/PRECISION/ when run again
# (e.g. after the machine went away). Resuming is exact on the CPU (tests/train), so an interrupted run
# follows the same loss curve as an uninterrupted one at the same thread count.
set -euo pipefail

table() {
  local out=$1; shift
  echo "| precision | epochs done | test accuracy (last epoch) | best epoch | train loss (last epoch) | skipped steps | images/s (median over steps) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for p in "$@"; do
    local log=$out/$p/log.jsonl
    [ -f "$log" ] || { echo "| $p | 0 | - | - | - | - | - |"; continue; }
    # the step records' throughput (images over the epoch's time so far in that process): its median is
    # robust to the pauses and restarts that the epochs' own seconds include
    local ips
    ips=$({ grep '"type":"step"' "$log" || true; } | sed -n 's/.*"throughput":\([0-9.eE+-]*\).*/\1/p' | sort -g |
          awk '{ v[NR] = $1 } END { if (NR) printf "%.1f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; else printf "-" }')
    # one record per epoch, the last one written (an epoch that an older mixprec redid after a resume is
    # logged twice: Note [a resumed run's log] in src/train/run_log.cpp)
    { grep '"type":"epoch"' "$log" || true; } | awk -v p="$p" -v ips="$ips" '
      { match($0, /"epoch":[0-9]+/); e = substr($0, RSTART + 8, RLENGTH - 8) + 0
        match($0, /"val_accuracy":[0-9.eE+-]+/); a[e] = substr($0, RSTART + 15, RLENGTH - 15) + 0
        match($0, /"train_loss":[0-9.eE+-]+/); l[e] = substr($0, RSTART + 13, RLENGTH - 13)
        match($0, /"skipped_total":[0-9]+/); k[e] = substr($0, RSTART + 16, RLENGTH - 16)
        if (e > last) last = e }
      END { n = 0; for (e in a) { n++; if (a[e] > best) { best = a[e]; be = e } }
            if (n == 0) { printf "| %s | 0 | - | - | - | - | %s |\n", p, ips; exit }
            printf "| %s | %d | %.2f%% | %.2f%% (epoch %d) | %.4f | %d | %s |\n",
                   p, n, 100 * a[last], 100 * best, be, l[last], k[last], ips }'
  done
}

if [ "${1:-}" = "--table" ]; then
  [ $# -ge 2 ] || { echo "usage: $0 --table OUT_DIR [PRECISION ...]" >&2; exit 2; }
  out=$2; shift 2
  [ $# -gt 0 ] || set -- fp32 bf16
  table "$out" "$@"
  exit 0
fi

[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR OUT_DIR [PRECISION ...]  (or --table OUT_DIR ...)" >&2; exit 2; }
build=$1 out=$2; shift 2
[ $# -gt 0 ] || set -- fp32 bf16
bin=$build/apps/mixprec/mixprec
[ -x "$bin" ] || { echo "$0: no mixprec binary at $bin: build first (make -C $build mixprec_cli)" >&2; exit 2; }
mkdir -p "$out"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores" | tee "$out/machine.txt"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  | tee -a "$out/machine.txt"

pids=()
for p in "$@"; do
  d=$out/$p
  mkdir -p "$d"
  resume=()
  [ -f "$d/checkpoint.safetensors" ] && resume=(--resume)
  OMP_NUM_THREADS=${THREADS:-1} "$bin" train --model resnet18 --dataset fashion-mnist --augment \
    --epochs "${EPOCHS:-15}" --warmup_epochs 1 --precision "$p" --device "${DEVICE:-cpu}" --checkpoint_dir "$d" --checkpoint_every 100 \
    --log "$d/log.jsonl" --quiet "${resume[@]}" >> "$d/out.log" 2>&1 &
  pids+=($!)
  echo "$p: pid $!, log $d/out.log${resume:+ (resumed)}"
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
table "$out" "$@"
exit $status
