#!/usr/bin/env python3
"""mixprec's fused CPU attention against PyTorch 2.x's F.scaled_dot_product_attention, side by side in one run
(issue 27 item 5): causal, batch 4, 6 heads, head size 64 by default, sequence lengths 128-4096, forward +
backward and forward alone, in bf16 and f32. Each (framework, dtype, T) is its own process
(BUILD_DIR/bench/bench_sdpa and bench/pytorch/bench_sdpa.py, which print the same JSON), the frameworks
alternating (the order reversed on every other round) so that drift of a shared machine hits both. A cell is
the median over rounds of the per-process medians, with the range; a ratio is the median over rounds of
PyTorch's time / mixprec's time. Memory: each process's peak resident set above what it held before its
first call (the same measure on both sides).

    bench/compare_attention.py BUILD_DIR [--rounds 3] [--lengths 128,256,...] [--dtypes bf16,f32]
        [--batch 4] [--heads 6] [--head_dim 64] [--python .venv-bench/bin/python] [--out FILE.jsonl]
    bench/compare_attention.py --table FILE.jsonl      # the tables of a saved run

Threads: OMP_NUM_THREADS (default: nproc) for both frameworks (torch reads it too).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return "unknown CPU"


def run_one(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare_attention: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt(vals):
    m = statistics.median(vals)
    return f"{m:.1f} ({min(vals):.1f}-{max(vals):.1f})" if len(vals) > 1 else f"{m:.1f}"


def table(records):
    keys = sorted({(r["dtype"], r["T"]) for r in records}, key=lambda k: (k[0] != "bf16", k[1]))
    torch_name = next((r["framework"] for r in records if r["framework"] != "mixprec"), "torch")
    first = records[0]
    print(f"causal, B={first['B']} H={first['H']} D={first['D']}, {first['threads']} threads; "
          f"ms: median over rounds (range); x: {torch_name} time / mixprec time, median over rounds\n")
    print("| dtype | T | mixprec fwd+bwd | torch fwd+bwd | x | mixprec fwd | torch fwd | x | "
          "peak MiB mixprec / torch | mixprec GFLOP/s fwd+bwd |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dt, T in keys:
        rs = [r for r in records if r["dtype"] == dt and r["T"] == T]
        mine = [r for r in rs if r["framework"] == "mixprec"]
        theirs = [r for r in rs if r["framework"] != "mixprec"]
        if not mine or not theirs:
            continue
        by_round = {}
        for r in rs:
            by_round.setdefault(r["round"], {})["m" if r["framework"] == "mixprec" else "t"] = r
        ratio = lambda key: statistics.median(
            [v["t"][key] / v["m"][key] for v in by_round.values() if "m" in v and "t" in v])
        mib = lambda xs: statistics.median([x["peak_rss_above_start_bytes"] for x in xs]) / 2**20
        r0 = mine[0]
        pairs = T * (T + 1) / 2 if r0["causal"] else T * T
        flop = 3.5 * 4 * r0["B"] * r0["H"] * r0["D"] * pairs
        gflops = flop / (statistics.median([x["fwd_bwd_ms"] for x in mine]) * 1e6)
        print(f"| {dt} | {T} | {fmt([x['fwd_bwd_ms'] for x in mine])} | {fmt([x['fwd_bwd_ms'] for x in theirs])} | "
              f"{ratio('fwd_bwd_ms'):.2f} | {fmt([x['fwd_ms'] for x in mine])} | {fmt([x['fwd_ms'] for x in theirs])} | "
              f"{ratio('fwd_ms'):.2f} | {mib(mine):.0f} / {mib(theirs):.0f} | {gflops:.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?")
    ap.add_argument("--table", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="128,256,512,1024,2048,4096")
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv-bench", "bin", "python"))
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.table:
        table([json.loads(l) for f in a.table for l in open(f) if l.strip()])
        return 0
    if not a.build:
        ap.error("give BUILD_DIR (or --table FILE.jsonl)")
    exe = os.path.join(a.build, "bench", "bench_sdpa")
    if not os.access(exe, os.X_OK):
        sys.exit(f"compare_attention: no {exe}: build it (cmake --build {a.build} --target bench_sdpa)")
    if not os.access(a.python, os.X_OK):
        sys.exit(f"compare_attention: no Python at {a.python}: run scripts/setup.sh --bench, or pass --python")
    out = a.out or os.path.join(a.build, "bench-compare-attention.jsonl")
    lengths = [int(x) for x in a.lengths.split(",")]
    records = []
    print(f"# {cpu_model()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', os.cpu_count())}", flush=True)
    with open(out, "w") as f:
        for rnd in range(a.rounds):
            for T in lengths:
                for dt in a.dtypes.split(","):
                    reps, warm = ("5", "2") if T < 2048 else ("3", "1")
                    args = [dt, str(a.batch), str(a.heads), str(T), str(a.head_dim), "1", reps, warm]
                    cmds = [[exe] + args, [a.python, os.path.join(ROOT, "bench", "pytorch", "bench_sdpa.py")] + args]
                    if rnd % 2:
                        cmds.reverse()
                    for cmd in cmds:
                        rec = run_one(cmd)
                        rec["round"] = rnd
                        records.append(rec)
                        f.write(json.dumps(rec) + "\n")
                        f.flush()
            print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    table(records)
    print(f"\nrecords: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
