#!/usr/bin/env python3
"""The PyTorch twin of `mixprec bench kernels` (apps/mixprec/bench_kernels.cpp): GEMM TFLOP/s per dtype
(torch.matmul = cuBLAS/cuBLASLt on a GPU) and element-wise bandwidth (copy, add, mul, relu, casts),
printing the same JSON object. On a GPU, torch's matmul is the "cuBLAS alone" reference of issue 5 and its
copy the copy-bandwidth reference.

    python3 bench/pytorch/bench_kernels.py --device cuda
"""
import argparse
import json
import sys
import time

import torch


def time_median(dev, iters, f):
    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    f()
    sync()
    s = []
    for _ in range(iters):
        t0 = time.perf_counter()
        f()
        sync()
        s.append(time.perf_counter() - t0)
    s.sort()
    return s[len(s) // 2]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--m", type=int, default=0)
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--k", type=int, default=0)
    p.add_argument("--elements", type=int, default=0)
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--dtypes", default="f32,tf32,f16,bf16")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    gpu = dev.type == "cuda"
    if gpu and not torch.cuda.is_available():
        p.error("--device %s: torch %s sees no CUDA device" % (a.device, torch.__version__))
    m = a.m or (8192 if gpu else 1024)
    n, k = a.n or m, a.k or m
    elements = a.elements or ((1 << 28) if gpu else (1 << 24))
    iters = a.iters or (20 if gpu else 3)
    out = {"framework": "pytorch", "version": torch.__version__,
           "device": "%s: %s" % (a.device, torch.cuda.get_device_name(dev)) if gpu else "cpu"}
    gemm = []
    for name in a.dtypes.split(","):
        if name not in ("f32", "tf32", "f16", "bf16"):
            p.error("unknown dtype %r in --dtypes" % name)
        dt = {"f16": torch.float16, "bf16": torch.bfloat16}.get(name, torch.float32)
        if gpu:
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        row = {"dtype": name, "m": m, "n": n, "k": k}
        try:
            x = torch.randn(m, k, device=dev).to(dt)
            w = torch.randn(k, n, device=dev).to(dt)
            sec = time_median(dev, iters, lambda: torch.matmul(x, w))
            row.update({"ms": sec * 1e3, "tflops": 2.0 * m * n * k / sec / 1e12})
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0]
        gemm.append(row)
    out["gemm"] = gemm
    x = torch.randn(elements, device=dev)
    y = torch.randn(elements, device=dev)
    xb = x.to(torch.bfloat16)
    ops = [("copy f32", 8, lambda: x.clone()), ("add f32", 12, lambda: x + y), ("mul f32", 12, lambda: x * y),
           ("relu f32", 8, lambda: torch.relu(x)), ("cast f32->bf16", 6, lambda: x.to(torch.bfloat16)),
           ("cast bf16->f32", 6, lambda: xb.float()), ("add bf16", 6, lambda: xb + xb)]
    ew = []
    for name, bpe, f in ops:
        sec = time_median(dev, iters, f)
        ew.append({"op": name, "elements": elements, "ms": sec * 1e3, "gbps": bpe * elements / sec / 1e9})
    out["elementwise"] = ew
    line = json.dumps(out)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
