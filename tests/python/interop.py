"""PyTorch's side of the interchange test (tests/cli/test_interop.cpp), on Debian's python3-torch 1.13 with
Python's safetensors (scripts/setup.sh installs both; .deps/python on PYTHONPATH).

    interop.py write MODEL CIN SIZE CLASSES STATE_OUT IO_OUT
        The PyTorch twin of mixprec's MODEL (bench/pytorch/models.py) after three training-mode forwards (so the
        batch-norm running statistics and num_batches_tracked are not their initial values), saved as a bare
        state dict (safetensors.torch.save_file(model.state_dict())); IO_OUT holds an input `x` and the eval-mode
        `logits` PyTorch computes for it.
    interop.py check MODEL CIN SIZE CLASSES STATE IO [--same-as ORIGINAL]
        Loads STATE into the twin with load_state_dict(strict=True) and compares its eval-mode logits for IO's
        `x` with IO's `logits` (mixprec's). --same-as: every tensor of STATE equals ORIGINAL's exactly, dtype too.

Exit status 1 (with a message) when anything differs.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "pytorch"))
import models  # noqa: E402  (the twins; bench/pytorch/check_names.py checks their names against mixprec's)

# Both sides compute the same f32 function from the same weights with different kernels and summation orders
# (oneDNN vs ATen convolutions, batch norm, the pooled mean), so logits agree to f32 rounding, not bit for bit:
# measured 3e-8 to 5e-8 for resnet8 (logits ~0.2). 1e-5 absolute + 1e-4 relative is 200x that, room for other
# CPUs' kernels (AVX2 vs AVX-512 block sizes), while the faults this test is for stay far above it: the running
# variances not loaded move logits by 3e-2, the weights rounded to bf16 on the way by 7e-4 (and --same-as
# catches any change of a stored tensor exactly).
ATOL, RTOL = 1e-5, 1e-4


def twin(args):
    name, cin, size, classes = args[0], int(args[1]), int(args[2]), int(args[3])
    return models.create_image_model(name, cin, size, classes), cin, size


def write(args):
    torch.manual_seed(7)  # the initialisation too: the same file every run
    model, cin, size = twin(args)
    with torch.no_grad():
        model.train()
        for _ in range(3):  # running statistics away from (0, 1), num_batches_tracked 3
            model(torch.randn(8, cin, size, size) * 2 + 0.5)
        model.eval()
        x = torch.randn(4, cin, size, size)
        logits = model(x)
    save_file(model.state_dict(), args[4], metadata={"format": "pt"})
    save_file({"x": x, "logits": logits}, args[5])


def check(args):
    model, _, _ = twin(args)
    state = load_file(args[4])
    model.load_state_dict(state, strict=True)  # every name and shape, buffers included
    problems = []
    if "--same-as" in args:
        original = load_file(args[args.index("--same-as") + 1])
        if list(original) != list(state) and sorted(original) != sorted(state):
            problems.append("names differ: %s vs %s" % (sorted(original), sorted(state)))
        for k, v in original.items():
            w = state.get(k)
            if w is None or w.dtype != v.dtype or w.shape != v.shape or not torch.equal(w, v):
                problems.append("%s: %s %s in the original, %s after the round trip" %
                                (k, v.dtype, list(v.shape), None if w is None else "%s %s" % (w.dtype, list(w.shape))))
    io = load_file(args[5])
    model.eval()
    with torch.no_grad():
        logits = model(io["x"])
    err = (logits - io["logits"]).abs()
    print("interop.py: %s logits, max |torch - mixprec| = %.3g (max |logit| %.3g)" %
          (args[0], float(err.max()), float(io["logits"].abs().max())))
    if bool((err > ATOL + RTOL * io["logits"].abs()).any()):
        problems.append("logits differ beyond %g + %g |x|: max |diff| %.3g" % (ATOL, RTOL, float(err.max())))
    for p in problems:
        print("interop.py: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) < 8 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    sys.exit(write(sys.argv[2:]) if sys.argv[1] == "write" else check(sys.argv[2:]))
