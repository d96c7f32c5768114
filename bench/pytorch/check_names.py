"""Check mixprec's models against their PyTorch twins (bench/pytorch/models.py).

Reads the file that tests/models/test_models_torch_names.cpp writes when MP_NAMES_OUT is set:

    MP_NAMES_OUT=/tmp/mp_names.txt <build>/tests/test_models_torch_names
    python3 bench/pytorch/check_names.py /tmp/mp_names.txt      # or with MP_NAMES_OUT set

For each model it prints whether named_parameters() and state_dict() agree in names, shapes and order.
Where the file also carries values (tiny models), it loads mixprec's state dict into the PyTorch model
(strict) and compares the outputs in training mode (batch statistics) and eval mode (the running
statistics the training forward left), or for word LMs the logits and final state. Exit status 1 when
anything differs.
"""
import os
import sys

import torch

import models

# Both sides compute in f32 with different kernels and summation orders (oneDNN vs ATen, batch-norm
# statistics), so outputs agree to rounding: measured 1e-8 to 1e-6, except 2.4e-5 for the train-mode
# ResNet-50 (batch statistics over 3 images x 2x2 maps amplify rounding). 1e-4 absolute + 1e-3 relative
# leaves margin over that while any wiring error (a missing ReLU, a shortcut from the wrong tensor, a
# swapped gate) changes outputs by O(0.1).
ATOL, RTOL = 1e-4, 1e-3


def shape_token(shape):
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def parse_shape(tok):
    return [] if tok == "scalar" else [int(d) for d in tok.split("x")]


def build(header):
    kind, args = header[0], header[1:]
    if kind == "image":
        name, cin, size, classes = args[0], int(args[1]), int(args[2]), int(args[3])
        return models.create_image_model(name, cin, size, classes)
    if kind == "mlp":
        hidden = [int(h) for h in args[1].split(",") if h]
        return models.MLP(int(args[0]), hidden, int(args[2]), float(args[3]))
    if kind == "resnet":
        return models.ResNet(int(args[0]), int(args[1]), int(args[2]), int(args[3]), args[4])
    if kind == "wrn":
        return models.WideResNet(int(args[0]), int(args[1]), int(args[2]), int(args[3]), float(args[4]))
    if kind == "wordlm":
        return models.WordLM(int(args[0]), int(args[1]), int(args[2]), int(args[3]), args[4], float(args[5]),
                             args[6] == "1")
    raise ValueError("unknown model kind %r" % kind)


def read_blocks(path):
    blocks, cur = [], None
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "model":
                cur = {"header": parts[1:], "param": [], "state": [], "value": {}, "input": {}, "output": {}}
                blocks.append(cur)
            elif parts[0] in ("param", "state"):
                cur[parts[0]].append((parts[1], parts[2]))
            elif parts[0] in ("value", "input", "output"):
                shape = parse_shape(parts[2])
                integer = parts[3] == "i64"
                nums = parts[4:]
                t = torch.tensor([int(v) for v in nums] if integer else [float(v) for v in nums],
                                 dtype=torch.int64 if integer else torch.float32)
                cur[parts[0]][parts[1]] = t.reshape(shape)
            else:
                raise ValueError("bad line: " + line[:80])
    return blocks


def compare_lists(what, mine, theirs):
    if mine == theirs:
        return []
    problems = []
    mine_d, theirs_d = dict(mine), dict(theirs)
    for n in mine_d:
        if n not in theirs_d:
            problems.append("%s: %s only in mixprec" % (what, n))
        elif mine_d[n] != theirs_d[n]:
            problems.append("%s: %s shape %s in mixprec, %s in torch" % (what, n, mine_d[n], theirs_d[n]))
    for n in theirs_d:
        if n not in mine_d:
            problems.append("%s: %s only in torch" % (what, n))
    if not problems:
        problems.append("%s: same names and shapes, different order" % what)
    return problems


def close(name, a, b):
    if a.shape != b.shape:
        return ["%s: shape %s in mixprec, %s in torch" % (name, list(a.shape), list(b.shape))]
    err = (a - b).abs()
    bad = err > ATOL + RTOL * b.abs()
    if bool(bad.any()):
        return ["%s: max |diff| %.3g (of max |value| %.3g)" % (name, float(err.max()), float(b.abs().max()))]
    return []


def check_values(block, model):
    state = {k: v for k, v in block["value"].items()}
    problems = []
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        if block["header"][0] == "wordlm":
            model.eval()
            tokens = block["input"]["tokens"].long()
            h0 = block["input"]["h0"]
            hidden = (h0, block["input"]["c0"]) if "c0" in block["input"] else h0
            logits, hidden = model(tokens, hidden)
            problems += close("logits", block["output"]["logits"], logits)
            h = hidden[0] if isinstance(hidden, tuple) else hidden
            problems += close("h", block["output"]["h"], h)
            if isinstance(hidden, tuple):
                problems += close("c", block["output"]["c"], hidden[1])
        else:
            x = block["input"]["x"].float()
            model.train()
            problems += close("train output", block["output"]["train"], model(x))
            model.load_state_dict(state, strict=True)  # the running statistics of mixprec's training forward
            model.eval()
            problems += close("eval output", block["output"]["eval"], model(x))
    return problems


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MP_NAMES_OUT")
    if not path:
        sys.exit("usage: check_names.py NAMES_FILE (written by test_models_torch_names with MP_NAMES_OUT=NAMES_FILE)")
    torch.manual_seed(0)
    failures = 0
    for block in read_blocks(path):
        model = build(block["header"])
        params = [(n, shape_token(p.shape)) for n, p in model.named_parameters()]
        states = [(n, shape_token(t.shape)) for n, t in model.state_dict().items()]
        problems = compare_lists("parameters", block["param"], params)
        problems += compare_lists("state dict", block["state"], states)
        checked = "%d parameters (%d elements), %d state entries" % (
            len(params), sum(p.numel() for p in model.parameters()), len(states))
        if block["value"] and not problems:
            problems += check_values(block, model)
            checked += ", outputs"
        label = " ".join(block["header"])
        if problems:
            failures += 1
            print("MISMATCH %-40s %s" % (label, checked))
            for p in problems[:20]:
                print("    " + p)
        else:
            print("ok       %-40s %s" % (label, checked))
    print("%d model(s) differ" % failures if failures else "all models match")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
