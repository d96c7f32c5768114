#!/usr/bin/env bash
# mixprec vs PyTorch 2.x, one training step, side by side in one run (issue 6 item 7, issue 23 item 5).
#
#   bench/compare_pytorch.sh BUILD_DIR [--quick] [--rounds N] [--steps N] [--warmup N] [--only NAME]
#        [--out FILE.jsonl] [--python PY] [--extra-python PY|none] [--torch-blas DIR]
#        [--fp16-steps N] [--fp16-limit S] [--fp16-timeout S]
#   bench/compare_pytorch.sh --table FILE.jsonl [FILE.jsonl ...]   # the tables of saved runs, pooled
#
# For each of the issue's three CPU configurations
#   mlp      MLP 784-2048-2048-10 (28x28x1 input), batch 512, SGD momentum 0.9
#   resnet18 ResNet-18, CIFAR shape 32x32x3, batch 32, SGD momentum 0.9
#   lstm     word LM, LSTM 2 x 650, vocabulary 10k, sequence 35, batch 20, SGD momentum 0.9, clip 0.25, no dropout (the issue's configuration)
# and with --only: gpt (gpt-mini 6 x 384, context 256, V 8192, batch 16, AdamW, clip 1) or gpt2 (GPT-2 124M,
# context 1024, V 50304, batch 8, AdamW: ~6 TFLOP a step; PyTorch's CPU fp16 would take hours, so give it a
# short --fp16-timeout).
# it runs `mixprec bench step` (BUILD_DIR/apps/mixprec/mixprec) in fp32, bf16 O2, bf16 O1 and fp16 O2, and
# bench/pytorch/bench_step.py on PyPI's newest torch (--python, default .venv-bench/bin/python, made by
# scripts/setup.sh --bench) in fp32, bf16 autocast and fp16 autocast (torch.autocast('cpu')), with the
# same thread count, alternating the frameworks (the order reversed on every other round) so that drift of
# the shared machine hits both. PyTorch gets its best layout: ResNet-18 runs it in NCHW and channels_last
# (model and input .to(memory_format=torch.channels_last)) in fp32 and bf16, and the table takes the faster
# of the two, named; mixprec runs its conv nets channels-last (its CPU default). --extra-python (default:
# /usr/bin/python3 when it has a torch of its own, i.e. Debian's python3-torch 1.13; `none`: off) adds that
# torch's fp32 and bf16 as extra columns. Every run is its own process: warm-up steps, then timed steps,
# median per run; with several rounds a cell is the median over rounds of the per-run medians, with the
# spread (min-max over rounds) in brackets, ratios likewise.
#
# PyTorch's CPU fp16 can be extremely slow (f16 matmuls at 1-2 GFLOP/s without AVX512-FP16: 12 s per MLP
# step was seen), so its fp16 runs are capped: at most --fp16-steps timed steps (default 2) after at most
# 1 warm-up step, stopped early once they have run --fp16-limit seconds (default 60; at least one timed
# step), and killed after --fp16-timeout seconds (default 300; the table then gives a lower bound). The
# table marks every cut run.
#
# Prints markdown tables (CPU model and torch versions in the header; ms per step; PyTorch/mixprec time
# ratios with the issue's targets; fp32/bf16 and fp32/fp16 speed-ups; mixprec's kernel paths per bf16 and
# fp16 run; peak memory) and writes every run's JSON line to --out (default:
# BUILD_DIR/bench-compare-pytorch.jsonl). --quick: 1 warm-up + 3 timed steps, 1 round (minutes on 2
# cores); default: 3 + 10 steps, 3 rounds (the issue's targets want at least 5 rounds). Exit status 1 when
# a run failed (a capped fp16 run is not a failure).
# BLAS: PyPI's torch carries MKL for its f32 matmuls. Debian's torch uses the system libblas.so.3, and
# Debian's reference libblas3 is ~50x slower than OpenBLAS (setup.sh --bench installs OpenBLAS);
# --torch-blas DIR puts DIR first in LD_LIBRARY_PATH of the PyTorch runs only. The table names the BLAS.
# Threads: OMP_NUM_THREADS (default: nproc) for both frameworks. On a shared machine, a 2-thread run
# slows down several-fold whenever another process holds a core (OpenMP barriers); OMP_NUM_THREADS=1
# gives numbers that stay stable under such load.
set -euo pipefail

usage() { sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
[[ $# -ge 1 ]] || usage 2
[[ "$1" == "-h" || "$1" == "--help" ]] && usage 0
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# The harness's own helpers (JSON records, tables) need only the standard library.
TOOLPY=$(command -v python3 || echo /usr/bin/python3)
PY=""
EXTRA_PY=auto
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
FP16_WARMUP=1; FP16_STEPS=2; FP16_LIMIT=60; FP16_TIMEOUT=300
QUICK=0
need() { [[ $# -ge 2 ]] || { echo "compare_pytorch.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1; WARMUP=1; STEPS=3; ROUNDS=1 ;;
    --rounds) need "$@"; ROUNDS=$2; shift ;;
    --steps) need "$@"; STEPS=$2; shift ;;
    --warmup) need "$@"; WARMUP=$2; shift ;;
    --only) need "$@"; ONLY=$2; shift ;;
    --out) need "$@"; OUT=$2; shift ;;
    --python) need "$@"; PY=$2; shift ;;
    --extra-python) need "$@"; EXTRA_PY=$2; shift ;;
    --torch-blas) need "$@"; TORCH_BLAS=$2; shift ;;
    --fp16-steps) need "$@"; FP16_STEPS=$2; shift ;;
    --fp16-limit) need "$@"; FP16_LIMIT=$2; shift ;;
    --fp16-timeout) need "$@"; FP16_TIMEOUT=$2; shift ;;
    -h|--help) usage 0 ;;
    *) echo "compare_pytorch.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
  shift
done
# print_tables ELAPSED QUICK FILE...: the markdown tables of JSON-lines runs (exit 1 when a run failed).
print_tables() {
  "$TOOLPY" - "$@" <<'EOF'
import json, statistics, sys
elapsed, quick, paths = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
runs = []
for i, path in enumerate(paths):  # several files pool their rounds
    for l in open(path):
        if l.strip():
            r = json.loads(l)
            r["round"] = (i, r.get("round", 0))
            if "variant" not in r:  # files of the harness before issue 23: Debian's torch, no fp16
                fw = r.get("framework", "?")
                cl = r.get("memory_format", (r.get("config") or {}).get("memory_format")) == "channels_last"
                r["variant"] = "%s:%s:%s:%s" % (fw, r.get("precision"), r.get("opt_level"),
                                                "channels_last" if fw == "pytorch" and cl else "")
            runs.append(r)
TITLE = {"mlp": "MLP 784-2048-2048-10, batch 512", "resnet18": "ResNet-18 32x32x3, batch 32",
         "lstm": "LSTM LM 2x650, V 10k, seq 35, batch 20, no dropout",
         "gpt": "gpt-mini 6x384, context 256, V 8192, batch 16, AdamW",
         "gpt2": "GPT-2 124M 12x768, context 1024, V 50304, batch 8, AdamW"}
SHORT = {"mlp": "MLP", "resnet18": "ResNet-18", "lstm": "LSTM LM", "gpt": "gpt-mini", "gpt2": "GPT-2 124M"}
BF16_TARGET = {"mlp": 1.25, "resnet18": 1.25, "lstm": 2.0, "gpt": None, "gpt2": None}  # issue 23: mixprec bf16 O2 vs PyTorch's autocast
MF, M2, M1, MH = "mixprec:fp32:O0:", "mixprec:bf16:O2:", "mixprec:bf16:O1:", "mixprec:fp16:O2:"
PF, PB, PH = "pytorch:fp32:O0:", "pytorch:bf16:O1:", "pytorch:fp16:O1:"
XF, XB = "extra:fp32:O0:", "extra:bf16:O1:"
CL = "channels_last"

def sel(name, key):
    return [r for r in runs if r["bench"] == name and r["variant"] == key]

def has(name, key):
    return bool(sel(name, key))

def per_round(name, key):
    return {r["round"]: r["median_ms"] for r in sel(name, key) if r.get("median_ms") is not None}

def med(name, key):
    v = list(per_round(name, key).values())
    return statistics.median(v) if v else None

def best(name, key):
    """PyTorch's faster layout where both ran (by the median over rounds): (key, layout name or "")."""
    if not has(name, key + CL):
        return key, ""
    a, b = med(name, key), med(name, key + CL)
    if b is not None and (a is None or b < a):
        return key + CL, "channels_last"
    return key, "NCHW"

def num(v):
    return "%.0f" % v if v >= 100 else "%.1f" % v

def cut_of(name, key):
    return [r for r in sel(name, key) if r.get("cut")]

def fmt_ms(name, key, layout=""):
    rs = sel(name, key)
    if not rs:
        return "-"
    v = list(per_round(name, key).values())
    if not v:
        unsup = [r for r in rs if r.get("unsupported")]
        low = [r["at_least_ms"] for r in rs if r.get("at_least_ms") is not None]
        if low:
            return "> %s (killed)" % num(max(low))
        return "unsupported" if unsup and len(unsup) == len(rs) else "failed"
    s = num(statistics.median(v))
    if len(v) > 1:
        s += " (%s-%s)" % (num(min(v)), num(max(v)))
    if layout:
        s += " " + layout
    capped = sorted({r["steps"] for r in rs if r.get("fp16_cap") and r.get("median_ms") is not None})
    if capped:
        s += " (%s%s timed step%s)" % ("cut: " if cut_of(name, key) else "", "/".join(map(str, capped)),
                                       "" if capped == [1] else "s")
    return s

def ratio(name, ka, kb, target=None, soft=None):
    """Median over rounds of time(ka) / time(kb), each round's pair measured minutes apart (the interleaving);
    the range over rounds in brackets. A killed run gives a lower bound."""
    a, b = per_round(name, ka), per_round(name, kb)
    both = [a[k] / b[k] for k in a if k in b]
    if not both:
        low = {r["round"]: r["at_least_ms"] for r in sel(name, ka) if r.get("at_least_ms") is not None}
        lb = [low[k] / b[k] for k in low if k in b]
        if lb:
            return "> %.0fx (killed)" % min(lb)
        ra = sel(name, ka)
        return "n/a (unsupported)" if ra and all(r.get("unsupported") for r in ra) else "-"
    r = statistics.median(both)
    x = lambda v: "%.2f" % v if v < 10 else "%.0f" % v
    s = x(r) + "x"
    if len(both) > 1:
        s += " (%s-%s)" % (x(min(both)), x(max(both)))
    if target is not None:
        if r >= target:
            s += " ok (>= %gx)" % target
        elif soft is not None and r >= soft:
            s += " (>= %gx ok; %gx where it applies)" % (soft, target)
        else:
            s += " **below %gx**" % (soft if soft is not None else target)
    return s

def paths_summary(name, key):
    """mixprec's kernel_paths per run: the path counts (distinct ones joined) and measured / from cache per round."""
    rs = sorted((r for r in sel(name, key) if isinstance(r.get("kernel_paths"), dict)), key=lambda r: r["round"])
    if not rs:
        return "-"
    counts = []
    for r in rs:
        p = r["kernel_paths"].get("paths") or {}
        c = ", ".join("%s %d" % kv for kv in sorted(p.items(), key=lambda kv: (-kv[1], kv[0]))) or "no choice"
        if c not in counts:
            counts.append(c)
    meas = "/".join(str(r["kernel_paths"].get("measured", "?")) for r in rs)
    cache = "/".join(str(r["kernel_paths"].get("from_cache", "?")) for r in rs)
    mode = sorted({str(r["kernel_paths"].get("mode")) for r in rs if r["kernel_paths"].get("mode")})
    return "%s (measured %s, from cache %s%s)" % (" | ".join(counts), meas, cache,
                                                   ", mode " + "/".join(mode) if mode and mode != ["measure"] else "")

def mib(name, key, field):
    v = [r[field] for r in sel(name, key) if r.get(field) is not None]
    return "%.0f" % (max(v) / 2**20) if v else "n/a"

def first(side, field):
    return next((r[field] for r in runs if r["variant"].startswith(side + ":") and r.get(field)), None)

names = [n for n in ("mlp", "resnet18", "lstm", "gpt", "gpt2") if any(r["bench"] == n for r in runs)]
dev = next((r["device"] for r in runs if "device" in r), "?")
cpu = next((r["cpu_model"] for r in runs if r.get("cpu_model")), None) or dev
threads = next((r["threads"] for r in runs if "threads" in r), "?")
torch_v, extra_v, mp_v = first("pytorch", "version") or "?", first("extra", "version"), first("mixprec", "version") or "?"
blas = lambda side: ", ".join(sorted({str(r.get("blas")) for r in runs if r["variant"].startswith(side + ":")
                                       and "version" in r})) or "?"
steps = next((r["steps"] for r in runs if r["variant"].startswith("mixprec:") and "steps" in r), "?")
warm = next((r["warmup"] for r in runs if r["variant"].startswith("mixprec:") and "warmup" in r), "?")
rounds = len({r["round"] for r in runs})
loads = [r["load1"] for r in runs if "load1" in r]
load = "%.2f-%.2f" % (min(loads), max(loads)) if loads else "?"
has_extra = any(r["variant"].startswith("extra:") for r in runs)
print("### mixprec %s vs PyTorch %s, one training step (CPU: %s, %s threads)\n" % (mp_v, torch_v, cpu, threads))
print("- PyTorch: torch %s (%s), BLAS %s%s; mixprec: oneDNN." % (
    torch_v, first("pytorch", "python") or "?", blas("pytorch"),
    "; extra columns: torch %s (%s), BLAS %s" % (extra_v, first("extra", "python") or "?", blas("extra"))
    if has_extra else ""))
print("- %s warm-up + %s timed steps per run, %d round(s)%s, frameworks interleaved%s; 1-minute load average "
      "after each run %s%s." % (warm, steps, rounds, " from %d files" % len(paths) if len(paths) > 1 else "",
                                " (--quick)" if quick else "", load, "; %d s in all" % elapsed if elapsed > 0 else ""))
fp16cap = list(dict.fromkeys(r["fp16_cap"] for r in runs if r.get("fp16_cap")))
if fp16cap:
    print("- PyTorch fp16 runs capped: %s." % "; ".join(fp16cap))
print()
if any("/blas/libblas" in blas(s) for s in ("pytorch", "extra")):
    print("**warning**: a PyTorch ran on Debian's reference BLAS (libblas3), ~50x slower than OpenBLAS for f32 "
          "matmuls; its fp32 numbers are not a fair baseline (see --torch-blas).\n")

# ms per step
hdr = ["configuration", "mixprec fp32", "PyTorch fp32", "mixprec bf16 O2", "mixprec bf16 O1", "PyTorch bf16 autocast",
       "mixprec fp16 O2", "PyTorch fp16 autocast"]
if has_extra:
    hdr += ["torch %s fp32" % extra_v, "torch %s bf16 autocast" % extra_v]
print("| " + " | ".join(hdr) + " |")
print("|---" * len(hdr) + "|")
for n in names:
    (pf, lf), (pb, lb) = best(n, PF), best(n, PB)
    row = [TITLE[n], fmt_ms(n, MF), fmt_ms(n, pf, lf), fmt_ms(n, M2), fmt_ms(n, M1), fmt_ms(n, pb, lb), fmt_ms(n, MH),
           fmt_ms(n, PH)]
    if has_extra:
        row += [fmt_ms(n, XF), fmt_ms(n, XB)]
    print("| " + " | ".join(row) + " |")
print("\nms per step: median over rounds of each run's median (range over rounds in brackets). Where PyTorch ran "
      "in both layouts its faster one is shown and named (NCHW or channels_last; all layouts below); PyTorch fp16 "
      "runs NCHW. mixprec runs its conv nets channels-last on the CPU (--memory_format auto). (N timed steps): a "
      "capped PyTorch fp16 run; cut: its time limit stopped it early; (killed): no timed step finished before the "
      "time-out, the time is a lower bound (how long the step under way had run).\n")

# ratios
hdr = ["configuration", "bf16: PyTorch autocast / mixprec O2 (target >= 1.25x; LSTM >= 2x)", "fp32: PyTorch / mixprec (target >= 1)",
       "mixprec fp32 / bf16 O2 (target >= 1.7x where native bf16 GEMM >= 1.7x f32, else >= 1)",
       "fp16: PyTorch autocast / mixprec O2 (keep the lead: >= 1)", "mixprec fp32 / fp16 O2 (target >= 1)",
       "PyTorch autocast / mixprec bf16 O1", "PyTorch fp32 / bf16"]
if has_extra:
    hdr += ["torch %s bf16 / mixprec bf16 O2" % extra_v]
print("| " + " | ".join(hdr) + " |")
print("|---" * len(hdr) + "|")
for n in names:
    pf, pb = best(n, PF)[0], best(n, PB)[0]
    row = [SHORT[n], ratio(n, pb, M2, BF16_TARGET[n]),
           ratio(n, pf, MF, 1.0), ratio(n, MF, M2, 1.7, soft=1.0), ratio(n, PH, MH, 1.0), ratio(n, MF, MH, 1.0),
           ratio(n, pb, M1), ratio(n, pf, pb)]
    if has_extra:
        row.append(ratio(n, XB, M2))
    print("| " + " | ".join(row) + " |")
print("\nRatios: median over rounds of the ratio of the two runs' times in that round (range over rounds in "
      "brackets); above 1 means the denominator is faster. PyTorch's side is its faster layout. bf16 targets "
      "(issue 23): >= 1.25x on MLP and ResNet-18, >= 2x on the LSTM LM.\n")

# PyTorch's layouts, where both ran
both = [n for n in names if has(n, PF + CL) or has(n, PB + CL)]
if both:
    print("| PyTorch layouts | fp32 NCHW | fp32 channels_last | bf16 autocast NCHW | bf16 autocast channels_last |")
    print("|---|---|---|---|---|")
    for n in both:
        print("| %s | %s | %s | %s | %s |" % (SHORT[n], fmt_ms(n, PF), fmt_ms(n, PF + CL), fmt_ms(n, PB),
                                              fmt_ms(n, PB + CL)))
    print()

# mixprec's kernel paths
print("| mixprec kernel paths | bf16 O2 | bf16 O1 | fp16 O2 |")
print("|---|---|---|---|")
for n in names:
    print("| %s | %s | %s | %s |" % (SHORT[n], paths_summary(n, M2), paths_summary(n, M1), paths_summary(n, MH)))
print("\nKernel paths: how many primitives (per shape) took each path (native low-precision kernel, through f32, "
      "GEMM); measured / from cache: choices timed in that run / read from the per-machine cache, per round.\n")

# memory
print("| configuration | mixprec peak tensor MiB fp32 / bf16 O2 / bf16 O1 / fp16 O2 "
      "| max RSS MiB mixprec fp32 / bf16 O2 / bf16 O1 / fp16 O2 | max RSS MiB PyTorch fp32 / bf16 / fp16 "
      "| parameters mixprec / PyTorch |")
print("|---|---|---|---|---|")
for n in names:
    pf, pb = best(n, PF)[0], best(n, PB)[0]
    pm = {r["variant"].split(":")[0]: r["config"]["parameters"] for r in runs
          if r["bench"] == n and "parameters" in (r.get("config") or {})}
    print("| %s | %s | %s | %s | %s / %s |" % (
        SHORT[n], " / ".join(mib(n, k, "peak_bytes") for k in (MF, M2, M1, MH)),
        " / ".join(mib(n, k, "max_rss_bytes") for k in (MF, M2, M1, MH)),
        " / ".join(mib(n, k, "max_rss_bytes") for k in (pf, pb, PH)), pm.get("mixprec", "?"), pm.get("pytorch", "?")))
print("\nPeak tensor memory is mixprec's allocator statistic over the timed steps; torch keeps none for the CPU, so "
      "only each process's peak RSS (interpreter and libraries included) compares the two.")
bad = [n for n in names if len({r["config"]["parameters"] for r in runs
                                if r["bench"] == n and "parameters" in (r.get("config") or {})}) > 1]
if bad:
    print("\n**warning**: parameter counts differ between the frameworks for: " + ", ".join(bad))
for r in runs:
    if r.get("cut"):
        print("\n*cut*: %s %s round %s: %s" % (r["bench"], r["variant"].rstrip(":"), r["round"][1], r["cut"]))
for r in runs:
    if r.get("unsupported"):
        print("\n*unsupported*: %s %s round %s: %s" % (r["bench"], r["variant"].rstrip(":"), r["round"][1],
                                                      r["unsupported"]))
errors = [r for r in runs if "error" in r]
for r in errors:
    print("\n**failed**: %s %s round %s: %s" % (r["bench"], r["variant"].rstrip(":"), r["round"][1], r["error"]))
sys.exit(1 if errors else 0)
EOF
}

if [[ $TABLE_ONLY == 1 ]]; then
  print_tables 0 0 "${TABLE_FILES[@]}"
  exit $?
fi
OUT=${OUT:-$BUILD_DIR/bench-compare-pytorch.jsonl}
[[ -x "$MIXPREC" ]] || { echo "compare_pytorch.sh: no mixprec binary at $MIXPREC; build the mixprec_cli target in $BUILD_DIR" >&2; exit 2; }
if [[ -z "$PY" ]]; then
  PY="$ROOT/.venv-bench/bin/python"
  [[ -x "$PY" ]] || { echo "compare_pytorch.sh: no $PY: run scripts/setup.sh --bench (it makes .venv-bench/ with PyPI's newest torch), or pass --python PY" >&2; exit 2; }
fi
"$PY" -c 'import torch' 2>/dev/null || { echo "compare_pytorch.sh: $PY cannot import torch (scripts/setup.sh --bench installs it into .venv-bench/)" >&2; exit 2; }
torch_id() { "$1" -c 'import torch; print(torch.__version__, torch.__file__)' 2>/dev/null; }
MAIN_ID=$(torch_id "$PY")
if [[ "$EXTRA_PY" == auto ]]; then
  # Debian's python3-torch (1.13 on Debian 12), when it is there and is not the torch of --python.
  EXTRA_PY=none
  if [[ -x /usr/bin/python3 ]]; then
    X_ID=$(torch_id /usr/bin/python3 || true)
    [[ -n "$X_ID" && "$X_ID" != "$MAIN_ID" ]] && EXTRA_PY=/usr/bin/python3
  fi
elif [[ "$EXTRA_PY" != none ]]; then
  torch_id "$EXTRA_PY" >/dev/null || { echo "compare_pytorch.sh: --extra-python $EXTRA_PY cannot import torch" >&2; exit 2; }
fi
[[ -z "$TORCH_BLAS" || -d "$TORCH_BLAS" ]] || { echo "compare_pytorch.sh: --torch-blas '$TORCH_BLAS' is not a folder" >&2; exit 2; }
for v in "$ROUNDS" "$STEPS" "$WARMUP" "$FP16_STEPS" "$FP16_LIMIT" "$FP16_TIMEOUT"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "compare_pytorch.sh: --rounds/--steps/--warmup/--fp16-* take whole numbers, got '$v'" >&2; exit 2; }
done
[[ $ROUNDS -ge 1 && $STEPS -ge 1 && $FP16_STEPS -ge 1 && $FP16_TIMEOUT -ge 1 ]] || {
  echo "compare_pytorch.sh: --rounds, --steps, --fp16-steps and --fp16-timeout must be >= 1" >&2; exit 2; }
((FP16_WARMUP > WARMUP)) && FP16_WARMUP=$WARMUP
((FP16_STEPS > STEPS)) && FP16_STEPS=$STEPS
FP16_CAP="$FP16_WARMUP warm-up + at most $FP16_STEPS timed steps"
((FP16_LIMIT > 0)) && FP16_CAP+=", stopped after the step that passes ${FP16_LIMIT} s (at least one timed step)"
FP16_CAP+=", killed at ${FP16_TIMEOUT} s"
CPU_MODEL=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)

# Both frameworks get the thread count libgomp gives mixprec (torch 1.13 here would default to 1).
THREADS=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$THREADS

declare -A CONFIG=(
  [mlp]="--model mlp-2048x2 --batch_size 512 --image_size 28 --in_channels 1 --num_classes 10 --optimizer sgd"
  [resnet18]="--model resnet18 --batch_size 32 --image_size 32 --in_channels 3 --num_classes 10 --optimizer sgd"
  [lstm]="--model lstm --batch_size 20 --bptt 35 --vocab_size 10000 --embed_size 650 --hidden_size 650 --num_layers 2 --dropout 0 --optimizer sgd"
  [gpt]="--model gpt-mini --batch_size 16 --vocab_size 8192 --dropout 0 --optimizer adamw"
  [gpt2]="--model gpt2 --batch_size 8 --vocab_size 50304 --dropout 0 --optimizer adamw"
)
NAMES=(mlp resnet18 lstm)
if [[ -n "$ONLY" ]]; then
  [[ -n "${CONFIG[$ONLY]+x}" ]] || { echo "compare_pytorch.sh: --only takes mlp, resnet18, lstm, gpt or gpt2, got '$ONLY'" >&2; exit 2; }
  NAMES=("$ONLY")
fi
# Variant = side:precision:opt_level:memory_format (side: mixprec, pytorch = --python, extra = --extra-python;
# memory_format "" = each side's default), in the alternating order. ResNet-18 also runs PyTorch's fp32 and
# bf16 in channels_last (the table takes PyTorch's faster layout).
variants_of() {  # name -> VARIANTS
  local cl=0
  [[ $1 == resnet18 ]] && cl=1
  VARIANTS=(mixprec:fp32:O0: pytorch:fp32:O0:)
  ((cl)) && VARIANTS+=(pytorch:fp32:O0:channels_last)
  [[ $EXTRA_PY != none ]] && VARIANTS+=(extra:fp32:O0:)
  VARIANTS+=(mixprec:bf16:O2: pytorch:bf16:O1:)
  ((cl)) && VARIANTS+=(pytorch:bf16:O1:channels_last)
  [[ $EXTRA_PY != none ]] && VARIANTS+=(extra:bf16:O1:)
  VARIANTS+=(mixprec:bf16:O1: mixprec:fp16:O2: pytorch:fp16:O1:)
}

: > "$OUT"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
echo "compare_pytorch: $(date -u +%Y-%m-%dT%H:%MZ), ${CPU_MODEL:-unknown CPU}, $THREADS threads, warm-up $WARMUP + $STEPS timed steps, $ROUNDS round(s); torch ${MAIN_ID%% *} ($PY), extra: $EXTRA_PY; load average $LOAD_BEFORE" >&2

run_one() {  # name round variant
  local name=$1 round=$2 variant=$3 side prec lvl mf py line rc=0 tmp t_end warm=$WARMUP steps=$STEPS
  local -a pre=() post=()
  IFS=: read -r side prec lvl mf <<<"$variant"
  if [[ $side != mixprec && $prec == fp16 ]]; then
    warm=$FP16_WARMUP; steps=$FP16_STEPS
    pre=(timeout -k 10 "$FP16_TIMEOUT")
    post=(--time_limit "$FP16_LIMIT" --progress)
  fi
  local common="${CONFIG[$name]} --precision $prec --opt_level $lvl --warmup $warm --steps $steps"
  [[ -n "$mf" ]] && common+=" --memory_format $mf"
  tmp=$(mktemp)
  if [[ $side == mixprec ]]; then
    # shellcheck disable=SC2086
    "$MIXPREC" bench step $common >"$tmp" 2>"$tmp.err" || rc=$?
  else
    py=$PY
    [[ $side == extra ]] && py=$EXTRA_PY
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="${TORCH_BLAS:+$TORCH_BLAS${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}" \
      "${pre[@]}" "$py" "$HERE/pytorch/bench_step.py" $common --threads "$THREADS" "${post[@]}" >"$tmp" 2>"$tmp.err" || rc=$?
  fi
  t_end=$(date +%s.%N)
  line=$(grep '^{' "$tmp" | tail -n 1 || true)
  # One JSON line per run into $OUT (a failed run becomes {"error": ...}; a PyTorch fp16 run killed by the
  # time-out becomes "cut" with "at_least_ms"); a progress line on stderr.
  "$TOOLPY" - "$name" "$round" "$(cut -d' ' -f1 /proc/loadavg)" "$line" "$side" "$prec" "$lvl" "$rc" "$tmp.err" \
    "$variant" "${mf:-}" "$t_end" "${#pre[@]}" "$FP16_TIMEOUT" "$FP16_CAP" "$CPU_MODEL" >>"$OUT" <<'EOF'
import json, re, statistics, sys
(name, rnd, load, line, side, prec, lvl, rc, errfile, variant, mf, t_end, capped, timeout, cap,
 cpu) = sys.argv[1:]
capped = capped != "0"
fw = "mixprec" if side == "mixprec" else "pytorch"
err = open(errfile, errors="replace").read()
j = json.loads(line) if line and rc == "0" else None
if j is None and capped and rc in ("124", "137"):
    # killed by the time-out: the steps that finished, and a lower bound on the one that did not
    marks = [(m.group(1), float(m.group(2) or 0), float(m.group(3)))
             for m in re.finditer(r"bench_step: (first step|warm-up|timed)(?: \d+/\d+: ([0-9.]+) ms)? \(t=([0-9.]+)\)",
                                  err)]
    timed = [ms for what, ms, _ in marks if what == "timed"]
    j = {"framework": fw, "precision": prec, "opt_level": lvl, "median_ms": statistics.median(timed) if timed else None,
         "steps": len(timed), "warmup": sum(1 for m in marks if m[0] == "warm-up"), "step_ms": timed}
    if not timed:  # the step under way when it was killed ran at least this long
        j["at_least_ms"] = (float(t_end) - marks[-1][2]) * 1000.0 if marks else float(timeout) * 1000.0
    j["cut"] = "killed after %s s: %d warm-up and %d timed steps finished" % (timeout, j["warmup"], j["steps"])
    msg = "CUT (killed after %s s)" % timeout
elif j is None:
    j = {"framework": fw, "precision": prec, "opt_level": lvl, "error": "exit %s: %s" % (rc, err.strip()[-400:])}
    msg = "FAILED (exit %s): %s" % (rc, err.strip()[-400:])
elif j.get("median_ms") is None:
    msg = "unsupported: %s" % j.get("unsupported")
else:
    msg = "%.1f ms/step%s" % (j["median_ms"], " (cut: %s)" % j["cut"] if j.get("cut") else "")
if mf:
    j["memory_format"] = mf
print("  %-8s round %s %-28s %s" % (name, rnd, variant, msg), file=sys.stderr)
rec = {"bench": name, "round": int(rnd), "variant": variant, "load1": float(load), "cpu_model": cpu, **j}
if capped:
    rec["fp16_cap"] = cap
print(json.dumps(rec))
EOF
  rm -f "$tmp" "$tmp.err"
}

for name in "${NAMES[@]}"; do
  variants_of "$name"
  for ((r = 1; r <= ROUNDS; r++)); do
    order=("${VARIANTS[@]}")
    if ((r % 2 == 0)); then order=(); for ((i = ${#VARIANTS[@]} - 1; i >= 0; i--)); do order+=("${VARIANTS[$i]}"); done; fi
    for v in "${order[@]}"; do run_one "$name" "$r" "$v"; done
  done
done
ELAPSED=$(($(date +%s) - T0))

status=0
print_tables "$ELAPSED" "$QUICK" "$OUT" || status=$?
echo "JSON lines: $OUT" >&2
exit "$status"
