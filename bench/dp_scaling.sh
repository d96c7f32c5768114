#!/usr/bin/env bash
# Data-parallel throughput on this machine (issue 26 item 6; bench/RESULTS.md "Bucketed gradient all-reduce"):
# `mpirun -np 2` with one OpenMP thread per rank against one process with one thread, at the same batch per process,
# on ResNet-8 (Fashion-MNIST) and the word LM (KJV), with --bucket_mb 0 (one all-reduce after backward), 25 (the
# default) and a size that cuts the model into several buckets, the last also with MP_BUCKET_PROGRESS=0 (no MPI_Test
# from the hooks: Note [bucketed gradient all-reduce] 5). Configurations are interleaved within each round; before
# each run the script waits (up to QUIET_WAIT s) until no compiler runs on the machine (but at nice 19), and says how
# much CPU the run's processes got: "cpu 0.98" is user + system time per process and second of wall time (each rank
# had a core; MPI's waits spin, so waiting counts), "cpu 0.60" a run that shared its cores with others.
# Per run: the steady step time over steps 11..STEPS (from the run log's cumulative throughput), and rank 0's mean
# comm_wait and comm_in_backward over the same steps. Usage: bench/dp_scaling.sh [ROUNDS] (default 3).
# CONFIGS=shard runs instead one process, 2 ranks at --bucket_mb 0 and 25, and 2 ranks with --shard_optimizer (Note
# [sharded optimizer state]: one reduce-scatter and one all-gather after backward); EXTRA adds flags to every run
# (e.g. EXTRA="--optimizer adamw --precision bf16 --opt_level O2").
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MIXPREC:-build/apps/mixprec/mixprec}
OUT=${OUT:-/tmp/dp-scaling}
ROUNDS=${1:-3}
STEPS=${STEPS:-60}
QUIET_WAIT=${QUIET_WAIT:-60}
CONFIGS=${CONFIGS:-buckets}
EXTRA=${EXTRA:-}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MP_KERNEL_PATHS=pinned

compiling() {  # whether a compiler or linker runs at a priority above nice 19 (another session's build)
  ps -eo ni=,comm= | awk '$1 < 19 && ($2 == "cc1plus" || $2 == "ld") { found = 1 } END { exit !found }'
}

wait_quiet() {  # until no compiler runs, at most QUIET_WAIT seconds
  local t=0
  while compiling; do
    ((t >= QUIET_WAIT)) && { echo busy; return; }
    sleep 2
    t=$((t + 2))
  done
  echo quiet
}

resnet="--model resnet8 --dataset fashion-mnist --train_subset 16384 --batch_size 64"
lm="--model lstm --dataset kjv --batch_size 20"
common="--epochs 1 --stop_after_steps $STEPS --num_workers 0 --quiet $EXTRA"

run() {  # name ranks env model-args extra-args units-per-process-step
  local name=$1 n=$2 env=$3 args=$4 extra=$5 units=$6 state
  wait_quiet >/dev/null
  local log="$OUT/$name.r$round.jsonl"
  rm -f "$log"
  local TIMEFORMAT='%R %U %S' times
  if [[ $n == 1 ]]; then
    times=$( { time env $env "$M" train $args $common $extra --log "$log" >"$OUT/$name.r$round.out" 2>&1; } 2>&1)
  else
    times=$( { time env $env mpirun --allow-run-as-root --oversubscribe -np "$n" "$M" train $args $common $extra \
      --log "$log" >"$OUT/$name.r$round.out" 2>&1; } 2>&1)
  fi
  # the CPU the run's processes got per process and second of wall time: ~1 when each had a core (MPI's waits spin)
  state="$(awk -v n="$n" '{ printf "cpu %.2f", ($2 + $3) / ($1 * n) }' <<<"$times")"
  python3 - "$log" "$name" "$n" "$state" "$round" "$units" <<'EOF'
import json, sys
log, name, n, state, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
units = float(sys.argv[6]) * n  # global images or tokens per step
steps = [json.loads(l) for l in open(log) if '"type":"step"' in l]
# throughput is cumulative over the epoch: elapsed after step k = k * units / throughput_k
k1, k2 = 10, len(steps)
t1 = k1 * units / steps[k1 - 1]["throughput"]
t2 = k2 * units / steps[k2 - 1]["throughput"]
step = (t2 - t1) / (k2 - k1)
units_per_sec = units / step
rest = steps[k1:]
cw = sum(s.get("comm_wait", 0) for s in rest) / len(rest)
cb = sum(s.get("comm_in_backward", 0) for s in rest) / len(rest)
print(f"{name:28s} round {rnd} {state:8s} step {1e3*step:7.1f} ms  throughput {units_per_sec:8.1f}/s  "
      f"comm_wait {1e3*cw:6.2f} ms  comm_in_backward {1e3*cb:6.2f} ms")
EOF
}

for round in $(seq 1 "$ROUNDS"); do
  for m in resnet lm; do
    args=${!m}
    small=0.05 units=64  # ResNet-8: 78k parameters (0.3 MiB of f32), about 6 buckets at 0.05 MiB; 64 images a step
    [[ $m == lm ]] && small=2 units=700  # word LM: 4.7M parameters (18 MiB), 20 streams x 35 tokens a step
    run "$m.1proc" 1 "" "$args" "" $units
    run "$m.2ranks.b0" 2 "" "$args" "--bucket_mb 0" $units
    run "$m.2ranks.b25" 2 "" "$args" "--bucket_mb 25" $units
    if [[ $CONFIGS == shard ]]; then
      run "$m.2ranks.shard" 2 "" "$args" "--shard_optimizer" $units
      continue
    fi
    run "$m.2ranks.b$small" 2 "" "$args" "--bucket_mb $small" $units
    run "$m.2ranks.b$small.notest" 2 "MP_BUCKET_PROGRESS=0" "$args" "--bucket_mb $small" $units
  done
done | tee "$OUT/summary.txt"
