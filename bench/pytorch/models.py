"""PyTorch twins of mp::models (include/mp/models/*.hpp): the same architectures with identical
parameter and buffer names and shapes, so checkpoints move between mixprec and PyTorch and the
reference timings/accuracies are measured on the same networks.

- MLP: flatten, then `layers` = Sequential(Linear, ReLU, [Dropout], ..., Linear).
- ResNet (torchvision naming: conv1, bn1, layer1.0.conv1, ..., layer2.0.downsample.0/1, fc) with a
  CIFAR stem (3x3 conv stride 1, no max-pool): depths 18/34 (BasicBlock) and 50/101/152 (Bottleneck,
  expansion 4, stride on the 3x3 conv as torchvision v1.5), stage widths width*{1,2,4,8}.
- He et al.'s CIFAR ResNets, depth 6n+2 (8, 14, 20, 32, 44, 56, 110): 3 stages of n BasicBlocks,
  widths 16/32/64, projection shortcuts (option B), same naming.
- Wide-ResNet-d-k (Zagoruyko & Komodakis), pre-activation blocks: conv1, layer1..3.i.{bn1, conv1,
  bn2, conv2, shortcut}, bn, fc (see include/mp/models/wide_resnet.hpp).
- WordLM: PyTorch's examples/word_language_model RNNModel (encoder, rnn, decoder; tied weights).
- GPT: nanoGPT's model.py GPT (transformer.wte/wpe/h.i.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
  mlp.c_proj}/ln_f, lm_head tied to wte; F.scaled_dot_product_attention with is_causal, nanoGPT's flash path;
  GELU tanh as mixprec's), presets gpt-nano, gpt-mini, gpt2 as mp::models::gpt_preset.

Only torch itself is needed (torchvision is not): the ResNets are written out here.
"""
import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCHVISION_DEPTHS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
                      50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3]),
                      152: ("bottleneck", [3, 8, 36, 3])}
CIFAR_DEPTHS = [8, 14, 20, 32, 44, 56, 110]


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class MLP(nn.Module):
    def __init__(self, in_features, hidden, num_classes, dropout=0.0):
        super().__init__()
        mods, f = [], in_features
        for h in hidden:
            mods += [nn.Linear(f, h), nn.ReLU()]
            if dropout > 0:
                mods.append(nn.Dropout(dropout))
            f = h
        mods.append(nn.Linear(f, num_classes))
        self.layers = nn.Sequential(*mods)

    def forward(self, x):
        return self.layers(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """depth in TORCHVISION_DEPTHS (family 'torchvision') or 6n+2 (family 'cifar');
    width 0 = the family's default (64 torchvision, 16 cifar)."""

    def __init__(self, depth, in_channels=3, num_classes=10, width=0, family="auto", zero_init_residual=False):
        super().__init__()
        if family == "auto":
            family = "torchvision" if depth in TORCHVISION_DEPTHS else "cifar"
        if family == "torchvision":
            kind, blocks = TORCHVISION_DEPTHS[depth]
            width = width or 64
            widths = [width, 2 * width, 4 * width, 8 * width]
            strides = [1, 2, 2, 2]
        else:
            assert (depth - 2) % 6 == 0 and depth >= 8, depth
            kind, n = "basic", (depth - 2) // 6
            blocks = [n, n, n]
            width = width or 16
            widths = [width, 2 * width, 4 * width]
            strides = [1, 2, 2]
        block = BasicBlock if kind == "basic" else Bottleneck
        self.inplanes = width
        self.conv1 = conv3x3(in_channels, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        for i, (w, b, s) in enumerate(zip(widths, blocks, strides)):
            setattr(self, "layer%d" % (i + 1), self._make_layer(block, w, b, s))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)
        self.num_stages = len(widths)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)
                elif isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, block, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        for i in range(self.num_stages):
            x = getattr(self, "layer%d" % (i + 1))(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class WideBasic(nn.Module):
    """Pre-activation block: bn1-relu-conv1(stride)-bn2-relu-[dropout]-conv2, plus the input or, where
    the shape changes, a 1x1 conv `shortcut` of the activated input relu(bn1(x))."""

    def __init__(self, cin, cout, stride, dropout):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = conv3x3(cout, cout)
        self.dropout = dropout
        self.shortcut = conv1x1(cin, cout, stride) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        o = F.relu(self.bn1(x))
        y = self.conv1(o)
        y = F.relu(self.bn2(y))
        if self.dropout > 0:
            y = F.dropout(y, self.dropout, self.training)
        y = self.conv2(y)
        return y + (x if self.shortcut is None else self.shortcut(o))


class WideResNet(nn.Module):
    def __init__(self, depth=16, widen=4, in_channels=3, num_classes=10, dropout=0.0):
        super().__init__()
        assert (depth - 4) % 6 == 0, depth
        n = (depth - 4) // 6
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        self.conv1 = conv3x3(in_channels, widths[0])
        cin = widths[0]
        for i, (w, s) in enumerate(zip(widths[1:], [1, 2, 2])):
            blocks = []
            for j in range(n):
                blocks.append(WideBasic(cin, w, s if j == 0 else 1, dropout))
                cin = w
            setattr(self, "layer%d" % (i + 1), nn.Sequential(*blocks))
        self.bn = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.conv1(x))))
        x = F.relu(self.bn(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class WordLM(nn.Module):
    """PyTorch's examples/word_language_model RNNModel, returning logits [T*B, V]."""

    def __init__(self, vocab_size, embed_size=650, hidden_size=650, num_layers=2, cell="lstm", dropout=0.5,
                 tie_weights=False):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, embed_size)
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.rnn = rnn(embed_size, hidden_size, num_layers, dropout=dropout)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        if tie_weights:
            if hidden_size != embed_size:
                raise ValueError("tie_weights needs hidden_size == embed_size")
            self.decoder.weight = self.encoder.weight
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        self.vocab_size = vocab_size

    def forward(self, tokens, hidden=None):
        emb = self.drop(self.encoder(tokens))
        out, hidden = self.rnn(emb, hidden)
        out = self.drop(out)
        return self.decoder(out).view(-1, self.vocab_size), hidden


GPT_PRESETS = {"gpt-nano": (64, 3, 3, 48), "gpt-mini": (256, 6, 6, 384), "gpt2": (1024, 12, 12, 768)}


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: nanoGPT's flash path
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # torch 1.13 (Debian's): nanoGPT's written-out attention
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = F.dropout(F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1), p, self.training)
            y = att @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class GptBlock(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd), c_proj=nn.Linear(4 * n_embd, n_embd),
                                      dropout=nn.Dropout(dropout)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.dropout(m.c_proj(F.gelu(m.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, name, vocab_size, context=0, dropout=0.0):
        super().__init__()
        block, n_layer, n_head, n_embd = GPT_PRESETS[name]
        block = context or block
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block, n_embd), drop=nn.Dropout(dropout),
            h=nn.ModuleList([GptBlock(n_embd, n_head, dropout) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT
        for n, p in self.named_parameters():  # nanoGPT's initialisation
            if n.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif n.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def image_model_names():
    return (["mlp"] + ["resnet%d" % d for d in CIFAR_DEPTHS] + ["resnet%d" % d for d in sorted(TORCHVISION_DEPTHS)]
            + ["wrn-16-4", "wrn-16-8", "wrn-28-10", "wrn-40-4"])


def create_image_model(name, in_channels=3, image_size=32, num_classes=10):
    """The twin of mp::models::create_image_model (include/mp/models/registry.hpp)."""
    if name == "mlp":
        return MLP(in_channels * image_size * image_size, [512, 512], num_classes)
    m = re.fullmatch(r"resnet(\d+)", name)
    if m:
        return ResNet(int(m.group(1)), in_channels, num_classes)
    m = re.fullmatch(r"wrn-(\d+)-(\d+)", name)
    if m:
        return WideResNet(int(m.group(1)), int(m.group(2)), in_channels, num_classes)
    raise ValueError("unknown image model %r; known: %s" % (name, ", ".join(image_model_names())))


if __name__ == "__main__":
    for n in image_model_names():
        model = create_image_model(n)
        print("%-10s %12d parameters" % (n, sum(p.numel() for p in model.parameters())))
    lm = WordLM(10000)
    print("%-10s %12d parameters (word LM, V=10000, 650/650, 2 layers)" % ("wordlm", sum(p.numel() for p in lm.parameters())))
