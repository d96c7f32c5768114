#!/usr/bin/python3
"""The PyTorch twin of `mixprec bench step` (apps/mixprec/bench_cmd.cpp): times training steps of one
configuration on a fixed synthetic batch and prints the same JSON object.

    /usr/bin/python3 bench/pytorch/bench_step.py --model resnet18 --batch_size 32 --precision bf16

One step = zero_grad (set_to_none, as mixprec drops gradients), forward on the batch drawn once
(randn images and randint labels, or randint token windows [seq_len, batch] and targets), cross_entropy
on f32 logits, backward, [word LM: clip_grad_norm_ 0.25], optimizer step. The models are
bench/pytorch/models.py's twins of mp::models ("mlp-WxL" = MLP with L hidden layers of width W).

Precisions on the CPU:
- fp32: plain f32 (opt level "O0").
- bf16: torch.autocast('cpu', dtype=torch.bfloat16): PyTorch's CPU AMP, per-op casting with f32 weights,
  which is Apex's O1. There is no loss scaling (bf16 has f32's range; mixprec's bf16 runs use none either).
  PyTorch has no O2/O3 for the CPU, so only O1 is accepted.
- fp16: torch.autocast('cpu', dtype=torch.float16) with torch.amp.GradScaler('cpu') (torch 2.x). On a CPU
  without AVX512-FP16 its f16 matmuls can be extremely slow (seconds per MLP step): --time_limit caps a run.
  CPU autocast to float16 does not exist in torch 1.13 (autocast warns and disables itself, and f16 matmul
  is not implemented on the CPU), and in torch 2.x some CPU kernels have no f16 version (oneDNN's LSTM
  without AVX512-FP16 fails); where it is missing or a step fails the script prints the JSON object with
  "unsupported" set to the reason and null timings, and exits 0.

Time limit: --time_limit S stops a run once its steps (warm-up and timed) have taken S seconds: the warm-up
steps left are skipped and timing stops after the current timed step; at least one timed step always runs,
and "cut" in the JSON says what was cut (null when nothing was). --progress prints each step's time and the
wall-clock time (t=, seconds since the epoch) on stderr as it goes, so that a caller that has to kill a run
can still say how long its steps took.

On a GPU (--device cuda): autocast('cuda') in bf16 or fp16 (fp16 with torch.cuda.amp.GradScaler), TF32
off for matmuls and cuDNN (mixprec's default is true f32 too), cudnn.benchmark on; each step ends with
torch.cuda.synchronize, and peak_bytes is torch.cuda.max_memory_allocated over the timed steps.

Memory: torch has no allocator statistics for the CPU, so "peak_bytes" (mixprec: peak bytes of live tensors
during the timed steps) is null here; "max_rss_bytes" (the process's peak resident set, interpreter and
libraries included) is reported by both sides as a rough comparison.

BLAS: PyPI's torch carries MKL for its f32 matmuls ("blas": "MKL (in torch)"). Debian's torch runs them on
the system's libblas.so.3; the JSON's "blas" names the library this process loaded. With only Debian's
reference libblas3 they are ~50x slower than with OpenBLAS (apt-get install libopenblas0-openmp, or put its
openblas-openmp folder first in LD_LIBRARY_PATH); bf16 matmuls and convolutions run on oneDNN either way.

Threads: torch 1.13 on this machine defaults to 1 thread; --threads (default: OMP_NUM_THREADS, else the
CPUs this process may run on, which is what libgomp gives mixprec) is passed to torch.set_num_threads.
"""
import argparse
import json
import math
import os
import re
import resource
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (bench/pytorch/models.py)

LM_CELLS = ("lstm", "gru", "rnn")
GPTS = tuple(models.GPT_PRESETS)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18",
                   help="image model (mlp, mlp-WxL, resnet8..110, resnet18..152, wrn-D-K) or lstm, gru, rnn (word LM)")
    p.add_argument("--batch_size", type=int, default=0, help="images or token streams per step (0 = 32 images, 20 LM)")
    p.add_argument("--image_size", type=int, default=32, help="images: height = width")
    p.add_argument("--in_channels", type=int, default=3, help="images: channels")
    p.add_argument("--num_classes", type=int, default=10, help="images: classes")
    p.add_argument("--vocab_size", type=int, default=10000, help="word LM: vocabulary size")
    p.add_argument("--bptt", "--seq_len", dest="seq_len", type=int, default=35,
                   help="word LM: tokens per stream per step (mixprec's --bptt)")
    p.add_argument("--context", type=int, default=0, help="gpt: context length (0 = the preset's)")
    p.add_argument("--embed_size", type=int, default=650, help="word LM: embedding size")
    p.add_argument("--hidden_size", type=int, default=650, help="word LM: recurrent state size")
    p.add_argument("--num_layers", type=int, default=2, help="word LM: stacked recurrent layers")
    p.add_argument("--dropout", type=float, default=0.5, help="word LM: dropout probability")
    p.add_argument("--precision", default="fp32", help="fp32, bf16 (CPU autocast) or fp16 (unsupported on torch 1.13 CPU)")
    p.add_argument("--opt_level", default="", help="O0 for fp32; O1 (autocast, the default) for bf16/fp16")
    p.add_argument("--optimizer", default="sgd", help="sgd (momentum 0.9) or adamw")
    p.add_argument("--lr", type=float, default=0.0, help="learning rate (0 = 0.01 for sgd, 1e-3 for adamw)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--memory_format", default="contiguous",
                   help="images: contiguous (PyTorch's default) or channels_last (model and input converted with "
                        ".to(memory_format=torch.channels_last), PyTorch's NHWC path)")
    p.add_argument("--matmul_precision", default="highest", choices=["highest", "high"],
                   help="GPU f32 matmuls and convolutions: highest (true f32, TF32 off) or high (TF32 allowed), "
                        "as mixprec's flag of that name")
    p.add_argument("--json", default="", help="also append the JSON object as one line to this file")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (GPU: autocast('cuda'), GradScaler for fp16, "
                   "no TF32, cudnn.benchmark on)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (0 = OMP_NUM_THREADS, else the CPUs this process may use)")
    p.add_argument("--time_limit", type=float, default=0.0,
                   help="seconds (0 = none): once the steps have run this long, skip the warm-up steps left and stop "
                        "after the current timed step (at least one timed step runs); the JSON's 'cut' says so")
    p.add_argument("--progress", action="store_true",
                   help="print each step's time and the wall-clock time (t=, epoch seconds) on stderr as it goes")
    a = p.parse_args(argv)
    lm = a.model in LM_CELLS or a.model in GPTS
    if not lm and not is_image_model(a.model):
        p.error("unknown --model %r; expected an image model (mlp, mlp-WxL, resnet8..110, resnet18..152, wrn-D-K), "
                "lstm, gru, rnn or %s" % (a.model, ", ".join(GPTS)))
    if a.batch_size == 0:
        a.batch_size = 16 if a.model in GPTS else 20 if lm else 32
    positive = ["batch_size", "steps"] + (["vocab_size", "seq_len", "embed_size", "hidden_size", "num_layers"] if lm
                                          else ["image_size", "in_channels", "num_classes"])
    for name in positive:
        if getattr(a, name) <= 0:
            p.error("--%s must be positive, got %d" % (name, getattr(a, name)))
    if a.warmup < 0:
        p.error("--warmup must be >= 0, got %d" % a.warmup)
    if a.memory_format not in ("contiguous", "channels_last"):
        p.error("--memory_format must be contiguous or channels_last, got %r" % a.memory_format)
    if not 0 <= a.dropout < 1:
        p.error("--dropout must be in [0, 1), got %g" % a.dropout)
    if a.precision not in ("fp32", "fp16", "bf16"):
        p.error("unknown --precision %r; expected fp32, fp16 or bf16" % a.precision)
    if not a.opt_level:
        a.opt_level = "O0" if a.precision == "fp32" else "O1"
    want = "O0" if a.precision == "fp32" else "O1"
    if a.opt_level != want:
        p.error("--opt_level %s with --precision %s: PyTorch's CPU AMP is autocast, so only %s is available here"
                % (a.opt_level, a.precision, want))
    if a.optimizer not in ("sgd", "adamw"):
        p.error("unknown --optimizer %r; expected sgd or adamw" % a.optimizer)
    if a.lr < 0:
        p.error("--lr must be >= 0, got %g" % a.lr)
    if a.lr == 0:
        a.lr = 0.01 if a.optimizer == "sgd" else 1e-3
    if a.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", a.device):
        p.error("unknown --device %r; expected cpu, cuda or cuda:N" % a.device)
    if a.device != "cpu" and not torch.cuda.is_available():
        p.error("--device %s: torch %s sees no CUDA device" % (a.device, torch.__version__))
    if a.threads < 0:
        p.error("--threads must be >= 0, got %d" % a.threads)
    if not a.time_limit >= 0:
        p.error("--time_limit must be >= 0, got %g" % a.time_limit)
    if a.threads == 0:
        env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]
        a.threads = int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))
    return a


def mlp_config(name):
    m = re.fullmatch(r"mlp-([1-9]\d*)x([1-9]\d*)", name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_image_model(name):
    """The names mp::models::is_image_model accepts (include/mp/models/registry.hpp)."""
    if name == "mlp" or mlp_config(name):
        return True
    m = re.fullmatch(r"resnet([1-9]\d*)", name)
    if m:
        d = int(m.group(1))
        return d in models.TORCHVISION_DEPTHS or d in models.CIFAR_DEPTHS
    m = re.fullmatch(r"wrn-([1-9]\d*)-([1-9]\d*)", name)
    return bool(m) and int(m.group(1)) >= 10 and (int(m.group(1)) - 4) % 6 == 0


def create_image_model(a):
    wl = mlp_config(a.model)
    if wl:  # mlp-WxL (models.py's registry knows only the fixed "mlp")
        return models.MLP(a.in_channels * a.image_size * a.image_size, [wl[0]] * wl[1], a.num_classes)
    return models.create_image_model(a.model, a.in_channels, a.image_size, a.num_classes)


def cpu_brand():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def blas_library():
    """The BLAS torch's f32 matmuls run on: PyPI's torch carries MKL; Debian's python3-torch takes whatever
    libblas.so.3 is (the library this process loaded), and the reference one (libblas3) is ~50x slower than
    OpenBLAS."""
    try:
        info = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    except Exception:  # noqa: BLE001 (an older torch without __config__)
        info = None
    if info and info.group(1) == "mkl":
        return "MKL (in torch)"
    try:
        with open("/proc/self/maps") as f:
            # numpy's own OpenBLAS (a wheel's numpy.libs / scipy_openblas) is not the one torch calls
            paths = {line.split()[-1] for line in f if "blas" in line.rsplit("/", 1)[-1].lower()
                     and "numpy" not in line and "scipy_openblas" not in line}
    except OSError:
        return None
    return sorted(paths)[0] if paths else None


def fp16_autocast_support():
    """None when CPU autocast to float16 works here (with a CPU GradScaler), else the reason it does not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast("cpu", dtype=torch.float16):
                r = torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        except RuntimeError as e:
            return "torch %s: CPU autocast to float16 fails (%s)" % (torch.__version__, str(e).splitlines()[0])
    if r.dtype != torch.float16:
        return ("torch %s has no CPU autocast to float16 (autocast disables itself; f16 matmul is not implemented "
                "on the CPU)" % torch.__version__)
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        return "torch %s has no CPU GradScaler (torch.amp.GradScaler('cpu'))" % torch.__version__
    return None


def device_name(a):
    if a.device == "cpu":
        return "cpu: " + cpu_brand()
    return "%s: %s" % (a.device, torch.cuda.get_device_name(torch.device(a.device)))


def result_base(a, config):
    return {"framework": "pytorch", "version": torch.__version__, "blas": blas_library(), "model": a.model,
            "python": sys.executable, "config": config,
            "precision": a.precision, "opt_level": a.opt_level}


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    lm = a.model in LM_CELLS or a.model in GPTS
    gpt = a.model in GPTS
    if gpt:  # nanoGPT's train.py step: AdamW, gradient norm clipped at 1 (mixprec's gpt_workload)
        model = models.GPT(a.model, a.vocab_size, a.context, a.dropout)
        T = model.transformer.wpe.weight.shape[0]
        block, n_layer, n_head, n_embd = models.GPT_PRESETS[a.model]
        config = {"batch_size": a.batch_size, "context": T, "vocab_size": a.vocab_size, "n_layer": n_layer,
                  "n_head": n_head, "n_embd": n_embd, "dropout": a.dropout, "optimizer": a.optimizer, "lr": a.lr}
        x = torch.randint(0, a.vocab_size, (a.batch_size, T))
        y = torch.randint(0, a.vocab_size, (a.batch_size * T,))
        units, unit = a.batch_size * T, "tok/s"
    elif lm:
        model = models.WordLM(a.vocab_size, a.embed_size, a.hidden_size, a.num_layers, a.model, a.dropout)
        config = {"batch_size": a.batch_size, "seq_len": a.seq_len, "vocab_size": a.vocab_size,
                  "embed_size": a.embed_size, "hidden_size": a.hidden_size, "num_layers": a.num_layers,
                  "dropout": a.dropout, "optimizer": a.optimizer, "lr": a.lr}
        x = torch.randint(0, a.vocab_size, (a.seq_len, a.batch_size))
        y = torch.randint(0, a.vocab_size, (a.seq_len * a.batch_size,))
        units, unit = a.batch_size * a.seq_len, "tok/s"
    else:
        model = create_image_model(a)
        config = {"batch_size": a.batch_size, "in_channels": a.in_channels, "image_size": a.image_size,
                  "num_classes": a.num_classes, "optimizer": a.optimizer, "lr": a.lr,
                  "memory_format": a.memory_format}
        x = torch.randn(a.batch_size, a.in_channels, a.image_size, a.image_size)
        if a.memory_format == "channels_last":
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, a.num_classes, (a.batch_size,))
        units, unit = a.batch_size, "img/s"
    config["parameters"] = sum(p.numel() for p in model.parameters())
    config["matmul_precision"] = a.matmul_precision
    dev = torch.device(a.device)
    gpu = dev.type == "cuda"
    if gpu:
        # The fp32 baseline is true fp32 on both sides (mixprec's default float32 matmul precision is
        # "highest"), TF32 only with --matmul_precision high; cuDNN may pick its fastest algorithms (mixprec
        # caches its choice per shape too).
        tf32 = a.matmul_precision == "high"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
    model.to(dev)
    x, y = x.to(dev), y.to(dev)
    model.train()
    params = list(model.parameters())

    out = result_base(a, config)
    scaler = None
    if a.precision == "fp16" and gpu:
        scaler = torch.cuda.amp.GradScaler()
    elif a.precision == "fp16":
        reason = fp16_autocast_support()
        if reason:
            return unsupported(a, out, unit, reason)
        scaler = torch.amp.GradScaler("cpu")
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)

    if a.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=a.lr, momentum=0.9)
    else:
        opt = torch.optim.AdamW(params, lr=a.lr)

    skipped = [0]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            logits = model(x) if gpt or not lm else model(x)[0]  # word LM: zero initial state every step
        loss = F.cross_entropy(logits.float().view(y.numel(), -1), y)
        clip = 1.0 if gpt else 0.25
        if scaler is not None:
            scaler.scale(loss).backward()
            if lm:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, clip)
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped[0] += scaler.get_scale() < before  # the scale backs off exactly when the step was skipped
        else:
            loss.backward()
            if lm:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
        return loss

    def sync():
        if gpu:
            torch.cuda.synchronize(dev)

    def progress(what, i, n, step_ms):
        if a.progress:
            print("bench_step: %s %d/%d: %.1f ms (t=%.3f)" % (what, i, n, step_ms, time.time()), file=sys.stderr,
                  flush=True)

    if a.progress:
        print("bench_step: first step (t=%.3f)" % time.time(), file=sys.stderr, flush=True)
    t_begin = time.perf_counter()

    def over_time():
        return a.time_limit > 0 and time.perf_counter() - t_begin >= a.time_limit

    def run_steps():
        warm_done = 0
        for i in range(a.warmup):
            if over_time():
                break
            t0 = time.perf_counter()
            step()
            sync()
            warm_done += 1
            progress("warm-up", i + 1, a.warmup, (time.perf_counter() - t0) * 1000.0)
        sync()
        if gpu:
            torch.cuda.reset_peak_memory_stats(dev)
        ms = []
        loss = None
        for i in range(a.steps):
            if ms and over_time():
                break
            t0 = time.perf_counter()
            loss = step()
            sync()  # GPU kernels run asynchronously: the step ends when its work has
            ms.append((time.perf_counter() - t0) * 1000.0)
            progress("timed", i + 1, a.steps, ms[-1])
        return warm_done, ms, loss

    try:
        warm_done, ms, loss = run_steps()
    except RuntimeError as e:
        # torch 2.x's CPU fp16 autocast exists but not every kernel has an f16 CPU version (e.g. oneDNN's LSTM
        # on a CPU without AVX512-FP16: "could not create a primitive descriptor"): that is PyTorch's answer.
        if gpu or a.precision != "fp16":
            raise
        return unsupported(a, out, unit, "torch %s: a CPU fp16 autocast step fails: %s"
                           % (torch.__version__, str(e).strip().splitlines()[0]))
    cut = None
    if warm_done < a.warmup or len(ms) < a.steps:
        cut = "time limit %g s: %d of %d warm-up and %d of %d timed steps run" % (
            a.time_limit, warm_done, a.warmup, len(ms), a.steps)
    srt = sorted(ms)
    n = len(srt)
    med = srt[n // 2] if n % 2 else 0.5 * (srt[n // 2 - 1] + srt[n // 2])
    last = loss.item()
    if amp_dtype is None:
        amp = "O0 fp32"
    else:
        amp = "O1 %s (torch.autocast('%s')), loss scale %s" % (
            {"bf16": "bf16", "fp16": "f16"}[a.precision], dev.type, "dynamic" if scaler is not None else "none")
    out.update({"amp": amp, "warmup": warm_done, "steps": len(ms), "steps_requested": a.steps, "cut": cut,
                "median_ms": med, "min_ms": srt[0],
                "max_ms": srt[-1], "step_ms": ms, "throughput": units / (med / 1000.0), "unit": unit,
                # torch keeps no CPU allocator statistics (see the module docstring); on a GPU its caching
                # allocator's peak of allocated bytes is what mixprec's peak_bytes counts too
                "peak_bytes": torch.cuda.max_memory_allocated(dev) if gpu else None,
                "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "final_loss": last if math.isfinite(last) else None,
                "skipped_steps": skipped[0],
                "threads": torch.get_num_threads(), "device": device_name(a)})
    emit(out, a.json)
    return 0


def unsupported(a, out, unit, reason):
    """Prints the JSON object with "unsupported" set to the reason and null timings; exit status 0."""
    out.update({"amp": None, "unsupported": reason, "warmup": a.warmup, "steps": a.steps, "median_ms": None,
                "min_ms": None, "max_ms": None, "step_ms": [], "throughput": None, "unit": unit,
                "peak_bytes": None, "max_rss_bytes": None, "final_loss": None, "skipped_steps": None,
                "threads": torch.get_num_threads(), "device": device_name(a)})
    emit(out, a.json)
    return 0


def emit(obj, path):
    line = json.dumps(obj)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
