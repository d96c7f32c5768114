#!/usr/bin/env python3
"""The PyTorch twin of bench/bench_sdpa.cpp: one configuration of F.scaled_dot_product_attention on the CPU,
forward alone (no grad) and forward + backward (upstream gradient of ones), `warmup` calls then the median of
`repeats`, wall-clock and process CPU time, and the process's peak resident set above what it held just before
the first call; prints the same JSON object. Run side by side by bench/compare_attention.py.

    python bench/pytorch/bench_sdpa.py DTYPE(f32|bf16) B H T D [causal=1] [repeats=5] [warmup=2]
"""
import json
import resource
import sys
import time

import torch
import torch.nn.functional as F


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def main(argv):
    if len(argv) < 6 or argv[1] not in ("f32", "bf16"):
        print(__doc__, file=sys.stderr)
        return 2
    dtype = torch.float32 if argv[1] == "f32" else torch.bfloat16
    B, H, T, D = (int(x) for x in argv[2:6])
    causal = int(argv[6]) != 0 if len(argv) > 6 else True
    repeats = int(argv[7]) if len(argv) > 7 else 5
    warmup = int(argv[8]) if len(argv) > 8 else 2
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D).to(dtype).requires_grad_() for _ in range(3))
    g = torch.ones(B, H, T, D, dtype=dtype)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(g)
        for t in (q, k, v):
            t.grad = None

    def timed(f):
        for _ in range(warmup):
            f()
        w, c = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            f()
            c.append(1e3 * (time.process_time() - c0))
            w.append(1e3 * (time.perf_counter() - w0))
        w.sort()
        c.sort()
        return w[len(w) // 2], c[len(c) // 2]

    rss0 = rss_now()
    fb_ms, fb_cpu = timed(fwd_bwd)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    fwd_ms, fwd_cpu = timed(fwd)
    print(json.dumps({"framework": "torch " + torch.__version__, "dtype": argv[1], "B": B, "H": H, "T": T, "D": D,
                      "causal": causal, "threads": torch.get_num_threads(), "fwd_ms": round(fwd_ms, 3),
                      "fwd_cpu_ms": round(fwd_cpu, 3), "fwd_bwd_ms": round(fb_ms, 3),
                      "fwd_bwd_cpu_ms": round(fb_cpu, 3), "peak_rss_above_start_bytes": rss_peak,
                      "peak_allocated_bytes": None}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
