#!/usr/bin/env bash
# mixprec vs PyTorch, one training step, side by side in one run (issue 6, item 7 and the CPU targets).
#
#   bench/compare_pytorch.sh BUILD_DIR [--quick] [--rounds N] [--steps N] [--warmup N] [--only NAME]
#                            [--out FILE.jsonl] [--python PY] [--torch-blas DIR]
#   bench/compare_pytorch.sh --table FILE.jsonl [FILE.jsonl ...]   # the tables of saved runs, pooled
#
# For each of the issue's three CPU configurations
#   mlp      MLP 784-2048-2048-10 (28x28x1 input), batch 512, SGD momentum 0.9
#   resnet18 ResNet-18, CIFAR shape 32x32x3, batch 32, SGD momentum 0.9
#   lstm     word LM, LSTM 2 x 650, vocabulary 10k, sequence 35, batch 20, SGD momentum 0.9, clip 0.25
# it runs `mixprec bench step` (BUILD_DIR/apps/mixprec/mixprec) in fp32, bf16 O2 and bf16 O1, and
# bench/pytorch/bench_step.py (Debian's torch 1.13 by default) in fp32 and bf16 autocast, with the
# same thread count, alternating the two frameworks (mixprec fp32, PyTorch fp32, mixprec bf16 O2,
# PyTorch bf16, mixprec bf16 O1; the order reversed on every other round) so that drift of the shared
# machine hits both. mixprec runs its conv nets channels-last (NHWC, its CPU default), so ResNet-18 also
# runs PyTorch bf16 with model and input in torch.channels_last, PyTorch's own NHWC path. Every run is its own process: warm-up steps, then timed steps, median per run;
# with several rounds a cell is the median over rounds of the per-run medians (range in brackets).
#
# Prints a markdown table (ms per step, PyTorch/mixprec time ratios for fp32 and bf16 with the issue's
# targets, fp32/bf16 speed-ups of each framework, peak memory) and writes every run's JSON line to
# --out (default: BUILD_DIR/bench-compare-pytorch.jsonl). --quick: 1 warm-up + 3 timed
# steps, 1 round (minutes on 2 cores); default: 3 + 10 steps, 3 rounds. Exit status 1 when a run failed.
# BLAS: torch's f32 matmuls use the system libblas.so.3; Debian's reference libblas3 is ~50x slower
# than OpenBLAS, which would make PyTorch fp32 a straw man. --torch-blas DIR puts DIR (e.g. the
# openblas-openmp folder of an unpacked libopenblas0-openmp) first in LD_LIBRARY_PATH of the PyTorch
# runs only; the table names the BLAS each side used and warns about the reference one.
# Threads: OMP_NUM_THREADS (default: nproc) for both frameworks. On a shared machine, a 2-thread run
# slows down several-fold whenever another process holds a core (OpenMP barriers); OMP_NUM_THREADS=1
# gives numbers that stay stable under such load.
set -euo pipefail

usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
[[ $# -ge 1 ]] || usage 2
[[ "$1" == "-h" || "$1" == "--help" ]] && usage 0
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3
TABLE_ONLY=0
if [[ "$1" == "--table" ]]; then
  shift
  [[ $# -ge 1 ]] || { echo "compare_pytorch.sh: --table needs one or more JSON-lines files" >&2; exit 2; }
  for f in "$@"; do [[ -f "$f" ]] || { echo "compare_pytorch.sh: no file '$f'" >&2; exit 2; }; done
  TABLE_ONLY=1
  TABLE_FILES=("$@")
  set --
  BUILD_DIR=""
else
  BUILD_DIR=$1; shift
fi
MIXPREC="$BUILD_DIR/apps/mixprec/mixprec"
OUT=""
WARMUP=3; STEPS=10; ROUNDS=3; ONLY=""; TORCH_BLAS=""
QUICK=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1; WARMUP=1; STEPS=3; ROUNDS=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --python) PY=$2; shift ;;
    --torch-blas) TORCH_BLAS=$2; shift ;;
    -h|--help) usage 0 ;;
    *) echo "compare_pytorch.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
  shift
done
# print_tables ELAPSED QUICK FILE...: the markdown tables of JSON-lines runs (exit 1 when a run failed).
print_tables() {
  "$PY" - "$@" <<'EOF'
import json, statistics, sys
elapsed, quick, paths = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
runs = []
for i, path in enumerate(paths):  # several files pool their rounds
    for l in open(path):
        if l.strip():
            r = json.loads(l)
            r["round"] = (i, r.get("round", 0))
            # PyTorch's channels-last runs are their own variant; every other run has layout "".
            cl = r.get("memory_format", (r.get("config") or {}).get("memory_format")) == "channels_last"
            r["layout"] = "channels_last" if r.get("framework") == "pytorch" and cl else ""
            runs.append(r)
TITLE = {"mlp": "MLP 784-2048-2048-10, batch 512", "resnet18": "ResNet-18 32x32x3, batch 32",
         "lstm": "LSTM LM 2x650, V 10k, seq 35, batch 20"}
KEYS = [("mixprec", "fp32", "O0", ""), ("pytorch", "fp32", "O0", ""), ("mixprec", "bf16", "O2", ""),
        ("mixprec", "bf16", "O1", ""), ("pytorch", "bf16", "O1", "")]
PT_CL = ("pytorch", "bf16", "O1", "channels_last")  # resnet18 only: PyTorch's NHWC path

def key_of(r):
    return (r.get("framework"), r.get("precision"), r.get("opt_level"), r["layout"])

def cell(name, key):
    ms = [r["median_ms"] for r in runs if r["bench"] == name and key_of(r) == key and r.get("median_ms") is not None]
    return statistics.median(ms) if ms else None, ms

def fmt_ms(v, all_ms):
    if v is None:
        return "failed"
    s = "%.0f" % v if v >= 100 else "%.1f" % v
    if len(all_ms) > 1:
        s += " (%.0f-%.0f)" % (min(all_ms), max(all_ms)) if v >= 100 else " (%.1f-%.1f)" % (min(all_ms), max(all_ms))
    return s

def per_round(name, key):
    return {r["round"]: r["median_ms"] for r in runs if r["bench"] == name and key_of(r) == key
            and r.get("median_ms") is not None}

def ratio(name, ka, kb, target=None):
    """Median over rounds of time(ka) / time(kb), each round's pair measured minutes apart (the interleaving)."""
    a, b = per_round(name, ka), per_round(name, kb)
    both = [a[k] / b[k] for k in a if k in b]
    if not both:
        return "-"
    r = statistics.median(both)
    return "%.2fx%s" % (r, "" if target is None else (" ok" if r >= target else " **below %.1fx**" % target))

def peak(name, key):
    v = [r["peak_bytes"] for r in runs if r["bench"] == name and key_of(r) == key and r.get("peak_bytes") is not None]
    return "%.0f" % (max(v) / 2**20) if v else "n/a"

def rss(name, key):
    v = [r["max_rss_bytes"] for r in runs if r["bench"] == name and key_of(r) == key
         and r.get("max_rss_bytes") is not None]
    return "%.0f" % (max(v) / 2**20) if v else "n/a"

names = [n for n in ("mlp", "resnet18", "lstm") if any(r["bench"] == n for r in runs)]
first = next((r for r in runs if "device" in r), {})
torch_v = next((r["version"] for r in runs if r.get("framework") == "pytorch" and "version" in r), "?")
blas = sorted({str(r.get("blas")) for r in runs if r.get("framework") == "pytorch" and "version" in r})
mp_v = next((r["version"] for r in runs if r.get("framework") == "mixprec" and "version" in r), "?")
steps = next((r["steps"] for r in runs if "steps" in r), "?")
rounds = len({r["round"] for r in runs})
loads = [r["load1"] for r in runs if "load1" in r]
load = "%.2f-%.2f" % (min(loads), max(loads)) if loads else "?"
print("### mixprec %s vs PyTorch %s, one training step (%s, %s threads)\n" % (mp_v, torch_v, first.get("device", "?"),
      first.get("threads", "?")))
print("%s timed steps per run after warm-up, %d round(s)%s, frameworks interleaved%s; 1-minute load average after "
      "each run %s%s. PyTorch's BLAS (its f32 matmuls): %s; mixprec: oneDNN.\n"
      % (steps, rounds, " from %d files" % len(paths) if len(paths) > 1 else "", " (--quick)" if quick else "", load,
         "; %d s in all" % elapsed if elapsed > 0 else "", ", ".join(blas) or "?"))
if any("/blas/libblas" in b for b in blas):
    print("**warning**: PyTorch ran on Debian's reference BLAS (libblas3), ~50x slower than OpenBLAS for f32 matmuls; "
          "its fp32 numbers are not a fair baseline (see --torch-blas).\n")
print("| configuration | mixprec fp32 | PyTorch fp32 | mixprec bf16 O2 | mixprec bf16 O1 | PyTorch bf16 autocast "
      "| fp32: PyTorch / mixprec (target >= 1) | bf16: PyTorch autocast / mixprec O2 (target >= 1.5) "
      "| PyTorch autocast / mixprec O1 | mixprec fp32 / bf16 O2 | PyTorch fp32 / bf16 "
      "| PyTorch bf16 autocast, channels_last | PyTorch autocast channels_last / mixprec O2 |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    c = {k: cell(n, k) for k in KEYS}
    mf, pf, m2, m1, pb = KEYS
    has_cl = any(r["bench"] == n and key_of(r) == PT_CL for r in runs)
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        TITLE[n], *(fmt_ms(*c[k]) for k in KEYS), ratio(n, pf, mf, 1.0), ratio(n, pb, m2, 1.5),
        ratio(n, pb, m1), ratio(n, mf, m2), ratio(n, pf, pb), fmt_ms(*cell(n, PT_CL)) if has_cl else "-",
        ratio(n, PT_CL, m2) if has_cl else "-"))
print("\nms per step: median over rounds of each run's median (range over rounds in brackets). Ratios: median over "
      "rounds of the ratio of the two runs' times in that round; above 1 means the denominator is faster. mixprec "
      "runs its conv nets channels-last on the CPU (--memory_format auto); PyTorch's default is NCHW, and its "
      "channels-last run (model and input .to(memory_format=torch.channels_last)) is shown beside it.\n")
print("| configuration | mixprec peak tensor MiB fp32 / bf16 O2 / bf16 O1 | max RSS MiB mixprec fp32 / bf16 O2 / bf16 O1 "
      "| max RSS MiB PyTorch fp32 / bf16 | parameters mixprec / PyTorch |")
print("|---|---|---|---|---|")
for n in names:
    pm = {r.get("framework"): r["config"]["parameters"] for r in runs if r["bench"] == n and "config" in r}
    print("| %s | %s / %s / %s | %s / %s / %s | %s / %s | %s / %s |" % (
        TITLE[n], peak(n, KEYS[0]), peak(n, KEYS[2]), peak(n, KEYS[3]), rss(n, KEYS[0]), rss(n, KEYS[2]),
        rss(n, KEYS[3]), rss(n, KEYS[1]), rss(n, KEYS[4]), pm.get("mixprec", "?"), pm.get("pytorch", "?")))
print("\nPeak tensor memory is mixprec's allocator statistic over the timed steps; torch keeps none for the CPU, so "
      "only each process's peak RSS (interpreter and libraries included) compares the two.")
bad = [n for n in names if len({r["config"]["parameters"] for r in runs if r["bench"] == n and "config" in r}) > 1]
if bad:
    print("\n**warning**: parameter counts differ between the frameworks for: " + ", ".join(bad))
errors = [r for r in runs if "error" in r]
for r in errors:
    print("\n**failed**: %s %s %s %s %s: %s" % (r["bench"], r["framework"], r["precision"], r["opt_level"], r["layout"],
                                                r["error"]))
sys.exit(1 if errors else 0)
EOF
}

if [[ $TABLE_ONLY == 1 ]]; then
  print_tables 0 0 "${TABLE_FILES[@]}"
  exit $?
fi
OUT=${OUT:-$BUILD_DIR/bench-compare-pytorch.jsonl}
[[ -x "$MIXPREC" ]] || { echo "compare_pytorch.sh: no mixprec binary at $MIXPREC; build the mixprec_cli target in $BUILD_DIR" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "compare_pytorch.sh: $PY cannot import torch (apt-get install python3-torch)" >&2; exit 2; }
[[ -z "$TORCH_BLAS" || -d "$TORCH_BLAS" ]] || { echo "compare_pytorch.sh: --torch-blas '$TORCH_BLAS' is not a folder" >&2; exit 2; }
for v in "$ROUNDS" "$STEPS" "$WARMUP"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "compare_pytorch.sh: --rounds/--steps/--warmup take whole numbers, got '$v'" >&2; exit 2; }
done
[[ $ROUNDS -ge 1 && $STEPS -ge 1 ]] || { echo "compare_pytorch.sh: --rounds and --steps must be >= 1" >&2; exit 2; }

# Both frameworks get the thread count libgomp gives mixprec (torch 1.13 here would default to 1).
THREADS=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$THREADS

declare -A CONFIG=(
  [mlp]="--model mlp-2048x2 --batch_size 512 --image_size 28 --in_channels 1 --num_classes 10 --optimizer sgd"
  [resnet18]="--model resnet18 --batch_size 32 --image_size 32 --in_channels 3 --num_classes 10 --optimizer sgd"
  [lstm]="--model lstm --batch_size 20 --seq_len 35 --vocab_size 10000 --embed_size 650 --hidden_size 650 --num_layers 2 --optimizer sgd"
)
NAMES=(mlp resnet18 lstm)
if [[ -n "$ONLY" ]]; then
  [[ -n "${CONFIG[$ONLY]+x}" ]] || { echo "compare_pytorch.sh: --only takes mlp, resnet18 or lstm, got '$ONLY'" >&2; exit 2; }
  NAMES=("$ONLY")
fi
# Variant = framework:precision:opt_level[:memory_format], in the alternating order. ResNet-18 also runs
# PyTorch bf16 in channels-last (mixprec's conv nets are channels-last on the CPU by default).
VARIANTS=(mixprec:fp32:O0 pytorch:fp32:O0 mixprec:bf16:O2 pytorch:bf16:O1 mixprec:bf16:O1)
VARIANTS_RESNET=(mixprec:fp32:O0 pytorch:fp32:O0 mixprec:bf16:O2 pytorch:bf16:O1 mixprec:bf16:O1 pytorch:bf16:O1:channels_last)

: > "$OUT"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
echo "compare_pytorch: $(date -u +%Y-%m-%dT%H:%MZ), $THREADS threads, warm-up $WARMUP + $STEPS timed steps, $ROUNDS round(s); load average $LOAD_BEFORE" >&2

run_one() {  # name round variant
  local name=$1 round=$2 variant=$3 fw prec lvl mf line rc=0 tmp
  IFS=: read -r fw prec lvl mf <<<"$variant"
  local common="${CONFIG[$name]} --precision $prec --opt_level $lvl --warmup $WARMUP --steps $STEPS"
  [[ -n "$mf" ]] && common+=" --memory_format $mf"
  tmp=$(mktemp)
  if [[ $fw == mixprec ]]; then
    # shellcheck disable=SC2086
    "$MIXPREC" bench step $common >"$tmp" 2>"$tmp.err" || rc=$?
  else
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="${TORCH_BLAS:+$TORCH_BLAS${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}" \
      "$PY" "$HERE/pytorch/bench_step.py" $common --threads "$THREADS" >"$tmp" 2>"$tmp.err" || rc=$?
  fi
  line=$(grep '^{' "$tmp" | tail -n 1 || true)
  # One JSON line per run into $OUT (a failed run becomes {"error": ...}); a progress line on stderr.
  "$PY" - "$name" "$round" "$(cut -d' ' -f1 /proc/loadavg)" "$line" "$fw" "$prec" "$lvl" "$rc" "$tmp.err" "$variant" \
    "${mf:-}" >>"$OUT" <<'EOF'
import json, sys
name, rnd, load, line, fw, prec, lvl, rc, errfile, variant, mf = sys.argv[1:]
j = json.loads(line) if line and rc == "0" else None
if j is None:
    err = open(errfile, errors="replace").read().strip()[-400:]
    j = {"framework": fw, "precision": prec, "opt_level": lvl, "error": "exit %s: %s" % (rc, err)}
    if mf:
        j["memory_format"] = mf
    msg = "FAILED (exit %s): %s" % (rc, err)
elif j.get("median_ms") is None:
    msg = "unsupported: %s" % j.get("unsupported")
else:
    msg = "%.1f ms/step" % j["median_ms"]
print("  %-8s round %s %-18s %s" % (name, rnd, variant, msg), file=sys.stderr)
print(json.dumps({"bench": name, "round": int(rnd), "load1": float(load), **j}))
EOF
  rm -f "$tmp" "$tmp.err"
}

for name in "${NAMES[@]}"; do
  for ((r = 1; r <= ROUNDS; r++)); do
    if [[ $name == resnet18 ]]; then variants=("${VARIANTS_RESNET[@]}"); else variants=("${VARIANTS[@]}"); fi
    order=("${variants[@]}")
    if ((r % 2 == 0)); then order=(); for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[$i]}"); done; fi
    for v in "${order[@]}"; do run_one "$name" "$r" "$v"; done
  done
done
ELAPSED=$(($(date +%s) - T0))

status=0
print_tables "$ELAPSED" "$QUICK" "$OUT" || status=$?
echo "JSON lines: $OUT" >&2
exit "$status"
