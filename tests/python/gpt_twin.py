"""nanoGPT's side of the GPT parity test (tests/models/test_models_gpt.cpp, Gpt.*NanoGpt*), on Debian's
python3-torch with Python's safetensors in .deps/python.

    gpt_twin.py FILE N_LAYER N_HEAD
        FILE (safetensors) holds mixprec's Gpt state dict under nanoGPT's names, an input `idx` [B, T] and mixprec's
        `logits` [B, T, V]. The script builds nanoGPT's forward (model.py, eval mode: LayerNorm, causal
        self-attention written out, GELU tanh, tied head) in f64 from those tensors, loads them by name, and compares.

Exit status 1 (with a message) when a name is missing or the logits differ.
"""
import math
import sys

import torch
from safetensors.torch import load_file

path, n_layer, n_head = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = {k: v.double() if v.is_floating_point() else v for k, v in load_file(path).items()}
idx, ours = t.pop("idx"), t.pop("logits")
expected = ["transformer.wte.weight", "transformer.wpe.weight"]
for i in range(n_layer):
    for m in ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]:
        expected += [f"transformer.h.{i}.{m}.weight", f"transformer.h.{i}.{m}.bias"]
expected += ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]
if sorted(expected) != sorted(t):
    sys.exit(f"state dict names differ from nanoGPT's: missing {sorted(set(expected) - set(t))}, "
             f"extra {sorted(set(t) - set(expected))}")
if not torch.equal(t["lm_head.weight"], t["transformer.wte.weight"]):
    sys.exit("lm_head.weight is not the tied token embedding")


def ln(x, p):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), t[p + ".weight"], t[p + ".bias"], 1e-5)


def lin(x, p):
    return x @ t[p + ".weight"].T + t[p + ".bias"]


B, T = idx.shape
C = t["transformer.wte.weight"].shape[1]
x = t["transformer.wte.weight"][idx] + t["transformer.wpe.weight"][:T]
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
for i in range(n_layer):
    p = f"transformer.h.{i}"
    q, k, v = lin(ln(x, p + ".ln_1"), p + ".attn.c_attn").split(C, dim=2)
    q, k, v = (z.view(B, T, n_head, C // n_head).transpose(1, 2) for z in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // n_head)
    att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    x = x + lin(y, p + ".attn.c_proj")
    x = x + lin(torch.nn.functional.gelu(lin(ln(x, p + ".ln_2"), p + ".mlp.c_fc"), approximate="tanh"),
                p + ".mlp.c_proj")
logits = ln(x, "transformer.ln_f") @ t["lm_head.weight"].T
# mixprec ran in f32 (oneDNN GEMMs, the fused attention kernel, f32 LayerNorm) from the same weights: measured
# 1.7e-7 apart (logits of a fresh model are small, weights N(0, 0.02)). 1e-4 is ~600x that, while a wrong head
# split (3 vs 1 heads) differs by 2e-3, and a wrong name, layout, mask or GELU form fails the same way.
err = (logits - ours).abs().max().item()
if not err <= 1e-4:
    sys.exit(f"logits differ from nanoGPT's forward by {err:.3g} (tolerance 1e-4)")
print(f"ok: max |difference| {err:.3g}")
