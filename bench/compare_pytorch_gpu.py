#!/usr/bin/env python3
"""mixprec vs PyTorch on a GPU, one training step, side by side in one run (issue 5's performance targets).

    python3 bench/compare_pytorch_gpu.py BUILD_DIR [--device cuda:0] [--rounds 2] [--steps 20] [--warmup 5]
                                         [--only resnet18|lstm] [--out FILE.jsonl]
                                         [--memory_format channels_last|contiguous]

Configurations (issue 5):
  resnet18  ResNet-18, CIFAR shape 32x32x3, batch 128, SGD momentum 0.9
  lstm      word LM, LSTM 2 x 1500, vocabulary 10k, sequence 35, batch 64, SGD momentum 0.9, clip 0.25
Variants, alternating the two frameworks (order reversed on every other round) so that drift hits both:
  mixprec fp32 (no TF32), PyTorch fp32 (TF32 off), mixprec fp16 O2 (dynamic loss scale), PyTorch fp16
  autocast + GradScaler, mixprec bf16 O2, PyTorch bf16 autocast, and fp32 with TF32 matmuls and convolutions
  in both (--matmul_precision high; PyTorch's allow_tf32 for matmuls and cuDNN).
ResNet-18 runs in --memory_format (default channels_last) in BOTH frameworks: mixprec's default on every
device and PyTorch's fastest layout for AMP on tensor cores (model and input .to(channels_last)); pass
contiguous to compare NCHW with NCHW (PyTorch's out-of-the-box layout).
Both frameworks pick convolution engines by timing them (bench_step.py sets cudnn.benchmark; mixprec runs with
MP_CUDNN_BENCHMARK=1, Note [cuDNN switches]).
Every run is its own process (`mixprec bench step --device D` and bench/pytorch/bench_step.py --device D);
a cell is the median over rounds of each run's median step time. Prints a markdown table with the issue's
ratios (mixprec fp32 / mixprec f16 and bf16: target >= 2; PyTorch AMP / mixprec: target > 1) and writes
every run's JSON line to --out (default BUILD_DIR/bench-compare-pytorch-gpu.jsonl). Exit status 1 when a
run failed (the table still prints, naming it).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = {
    "resnet18": ["--model", "resnet18", "--batch_size", "128", "--image_size", "32", "--in_channels", "3",
                 "--num_classes", "10", "--optimizer", "sgd"],
    "lstm": ["--model", "lstm", "--batch_size", "64", "--bptt", "35", "--vocab_size", "10000", "--embed_size",
             "1500", "--hidden_size", "1500", "--num_layers", "2", "--optimizer", "sgd"],
}
TITLE = {"resnet18": "ResNet-18 32x32x3, batch 128", "lstm": "LSTM LM 2x1500, V 10k, seq 35, batch 64"}
VARIANTS = [("mixprec", "fp32", "O0"), ("pytorch", "fp32", "O0"), ("mixprec", "fp16", "O2"),
            ("pytorch", "fp16", "O1"), ("mixprec", "bf16", "O2"), ("pytorch", "bf16", "O1"),
            ("mixprec", "tf32", "O0"), ("pytorch", "tf32", "O0")]


def run_one(a, name, variant, rnd):
    fw, prec, level = variant
    extra = ["--memory_format", a.memory_format] if name == "resnet18" else []
    # tf32: an fp32 run whose f32 matmuls and convolutions may use TF32 tensor cores.
    precision = ["--precision", "fp32", "--matmul_precision", "high"] if prec == "tf32" else ["--precision", prec]
    common = CONFIG[name] + extra + precision + ["--opt_level", level, "--warmup", str(a.warmup),
                                                 "--steps", str(a.steps), "--device", a.device]
    if fw == "mixprec":
        cmd = [os.path.join(a.build_dir, "apps", "mixprec", "mixprec"), "bench", "step"] + common
    else:
        cmd = [a.python, os.path.join(HERE, "pytorch", "bench_step.py")] + common
    rec = {"bench": name, "framework": fw, "precision": prec, "opt_level": level, "round": rnd}
    env = dict(os.environ, MP_CUDNN_BENCHMARK="1") if fw == "mixprec" else None  # as PyTorch's cudnn.benchmark
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        if p.returncode != 0 or not line.startswith("{"):
            rec["error"] = (p.stderr.strip() or p.stdout.strip() or "exit %d" % p.returncode)[-600:]
        else:
            rec.update(json.loads(line))
            rec["round"] = rnd
            rec["precision"] = prec  # the variant's name (a tf32 run reports precision fp32)
    except subprocess.TimeoutExpired:
        rec["error"] = "timed out after %d s" % a.timeout
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build_dir")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--only", choices=sorted(CONFIG), default=None)
    p.add_argument("--out", default="")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--memory_format", choices=["channels_last", "contiguous"], default="channels_last",
                   help="ResNet-18's activation layout in both frameworks")
    a = p.parse_args()
    if a.rounds < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--rounds and --steps must be >= 1, --warmup >= 0")
    exe = os.path.join(a.build_dir, "apps", "mixprec", "mixprec")
    if not os.access(exe, os.X_OK):
        p.error("no mixprec binary at %s; build the mixprec_cli target" % exe)
    out = a.out or os.path.join(a.build_dir, "bench-compare-pytorch-gpu.jsonl")
    names = [a.only] if a.only else list(CONFIG)
    runs = []
    t0 = time.time()
    with open(out, "w") as f:
        for rnd in range(a.rounds):
            order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
            for name in names:
                for v in order:
                    r = run_one(a, name, v, rnd)
                    runs.append(r)
                    f.write(json.dumps(r) + "\n")
                    f.flush()
                    ms = r.get("median_ms")
                    print("# %s %s %s %s: %s" % (name, *v, "%.2f ms" % ms if ms is not None else r.get("error", "?")),
                          file=sys.stderr)
    print_table(runs, time.time() - t0, a)
    return 1 if any("error" in r for r in runs) else 0


def print_table(runs, elapsed, a):
    def per_round(name, key):
        return {r["round"]: r["median_ms"] for r in runs if r["bench"] == name and
                (r["framework"], r["precision"], r["opt_level"]) == key and r.get("median_ms") is not None}

    def cell(name, key):
        v = list(per_round(name, key).values())
        if not v:
            return "failed"
        s = "%.1f" % statistics.median(v)
        return s + (" (%.1f-%.1f)" % (min(v), max(v)) if len(v) > 1 else "")

    def ratio(name, ka, kb, target=None, strict=False):
        x, y = per_round(name, ka), per_round(name, kb)
        both = [x[k] / y[k] for k in x if k in y]
        if not both:
            return "-"
        r = statistics.median(both)
        ok = r > target if strict else (target is not None and r >= target)
        if target is None:
            return "%.2fx" % r
        return "%.2fx %s" % (r, "ok" if ok else ("**not above %.1fx**" if strict else "**below %.1fx**") % target)

    dev = next((r["device"] for r in runs if "device" in r), a.device)
    versions = sorted({"%s %s" % (r["framework"], r["version"]) for r in runs if "version" in r})
    print("### mixprec vs PyTorch, one training step on %s\n" % dev)
    print("%d timed steps per run after %d warm-up steps, %d round(s), frameworks interleaved, %.0f s in all; %s.\n"
          % (a.steps, a.warmup, a.rounds, elapsed, ", ".join(versions)))
    mf, pf, m16, p16, mb, pb, mt, pt = VARIANTS
    print("| configuration | mixprec fp32 | PyTorch fp32 | mixprec fp16 O2 | PyTorch fp16 autocast | mixprec bf16 O2 "
          "| PyTorch bf16 autocast | mixprec tf32 | PyTorch tf32 | mixprec fp32 / fp16 (target >= 2) "
          "| mixprec fp32 / bf16 (target >= 2) | PyTorch fp16 / mixprec fp16 (target > 1) "
          "| PyTorch bf16 / mixprec bf16 (target > 1) | PyTorch fp32 / mixprec fp32 | PyTorch tf32 / mixprec tf32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sorted({r["bench"] for r in runs}, key=list(CONFIG).index):
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            TITLE[n], *(cell(n, k) for k in VARIANTS), ratio(n, mf, m16, 2.0), ratio(n, mf, mb, 2.0),
            ratio(n, p16, m16, 1.0, strict=True), ratio(n, pb, mb, 1.0, strict=True), ratio(n, pf, mf),
            ratio(n, pt, mt)))
    print("\nms per step (median over rounds of each run's median; range in brackets). Peak allocated MiB "
          "(mixprec / PyTorch):\n")
    print("| configuration | fp32 | fp16 | bf16 |")
    print("|---|---|---|---|")
    for n in sorted({r["bench"] for r in runs}, key=list(CONFIG).index):
        cells = []
        for prec in ("fp32", "fp16", "bf16"):  # tf32 runs hold what fp32 runs hold
            def pk(fw):
                v = [r["peak_bytes"] for r in runs if r["bench"] == n and r["framework"] == fw and
                     r["precision"] == prec and r.get("peak_bytes") is not None]
                return "%.0f" % (max(v) / 2**20) if v else "n/a"
            cells.append("%s / %s" % (pk("mixprec"), pk("pytorch")))
        print("| %s | %s |" % (TITLE[n], " | ".join(cells)))
    for r in runs:
        if "error" in r:
            print("\n**failed**: %s %s %s %s: %s" % (r["bench"], r["framework"], r["precision"], r["opt_level"],
                                                    r["error"]))


if __name__ == "__main__":
    sys.exit(main())
