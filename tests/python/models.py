#!/usr/bin/python3
"""PyTorch models that match paratrain's built-in models exactly (names, shapes, math).

GPT: GPT-2 architecture with the Hugging Face GPT-2 parameter names and shapes
(see ../../../shared/REFERENCE.md):
  wte.weight [V,C], wpe.weight [T,C],
  h.{i}.ln_1.weight|bias [C], h.{i}.attn.c_attn.weight [C,3C] / .bias [3C],
  h.{i}.attn.c_proj.weight [C,C] / .bias [C], h.{i}.ln_2.weight|bias [C],
  h.{i}.mlp.c_fc.weight [C,4C] / .bias [4C], h.{i}.mlp.c_proj.weight [4C,C] / .bias [C],
  ln_f.weight|bias [C].
  Linear layers are Conv1D (y = x @ W + b, W [in,out]); q,k,v packed along the output
  dim of c_attn in that order, heads are contiguous C/n_head slices; scores scaled by
  1/sqrt(C/n_head), causal; GELU tanh form; LayerNorm eps 1e-5; LM head tied to wte
  (logits = x @ wte^T, not a separate state_dict entry); loss = mean cross-entropy
  over all B*T positions; no dropout.

CNN (Fashion-MNIST): conv1 Conv2d(1,32,3,p=1) -> ReLU -> MaxPool2d(2) -> conv2
  Conv2d(32,64,3,p=1) -> ReLU -> MaxPool2d(2) -> flatten (N,3136) -> fc1 Linear(3136,128)
  -> ReLU -> fc2 Linear(128,10). torch layouts.
MLP (Fashion-MNIST): flatten 784 -> fc1 Linear(784,256) -> ReLU -> fc2 Linear(256,256)
  -> ReLU -> fc3 Linear(256,10).
Both classifiers: loss = mean cross-entropy over the batch.

`/usr/bin/python3 models.py` prints the parameter names and shapes of each preset.
"""
import argparse
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    block_size: int = 64
    vocab_size: int = 256

    @classmethod
    def from_dict(cls, d):
        keys = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"GPT config lacks {missing}")
        cfg = cls(**{k: int(d[k]) for k in keys})
        if cfg.n_embd % cfg.n_head != 0:
            raise ValueError(f"n_embd {cfg.n_embd} not divisible by n_head {cfg.n_head}")
        return cfg

    def to_dict(self):
        return asdict(self)


PRESETS = {
    "gpt-nano": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=256),
    "gpt-mini": GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=4096),
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024,
                           vocab_size=50257),
}


class Conv1D(nn.Module):
    """Hugging Face GPT-2 Conv1D: weight [in, out], y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shp = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shp)


def gelu_tanh(x):
    """0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), PyTorch's fused kernel (the self-test
    checks it against the explicit formula)."""
    return F.gelu(x, approximate="tanh")


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
        # a plain attribute, not a buffer: DDP would try to broadcast it and gloo has no bool
        self.mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        D = C // H
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(~self.mask[:T, :T].to(x.device), float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Conv1D(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLPBlock(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """GPT-2 with HF names at the top level (no 'transformer.' prefix), tied LM head."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.init_weights()

    def init_weights(self, generator=None):
        """GPT-2 init: normal(0, 0.02); c_proj weights std 0.02/sqrt(2*n_layer); biases
        zero; LayerNorm weight 1, bias 0."""
        std_proj = 0.02 / math.sqrt(2 * self.config.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("ln") or ".ln_" in name:
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, std_proj, generator=generator)
                else:
                    p.normal_(0.0, 0.02, generator=generator)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)[None]
        for blk in self.h:
            x = blk(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(B * T, -1).float() if logits.dtype in
                               (torch.float16, torch.bfloat16) else logits.view(B * T, -1),
                               targets.reshape(B * T).long())
        return logits, loss

    def num_params(self, non_embedding=False):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x, labels=None):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        logits = self.fc2(F.relu(self.fc1(x)))
        loss = None if labels is None else F.cross_entropy(logits, labels.long())
        return logits, loss


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x, labels=None):
        x = x.flatten(1)
        logits = self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))
        loss = None if labels is None else F.cross_entropy(logits, labels.long())
        return logits, loss


def build(model, config=None):
    """model: 'gpt' | 'cnn' | 'mlp' | a GPT preset name; config: dict for gpt."""
    if model in PRESETS:
        return GPT(PRESETS[model])
    if model == "gpt":
        cfg = config if isinstance(config, GPTConfig) else GPTConfig.from_dict(config or {})
        return GPT(cfg)
    if model == "cnn":
        return CNN()
    if model == "mlp":
        return MLP()
    raise ValueError(f"unknown model {model!r}")


def main():
    ap = argparse.ArgumentParser(description="Print parameter names and shapes of the models.")
    ap.add_argument("--model", default="all",
                    help="gpt-nano | gpt-mini | gpt2-124m | cnn | mlp | all")
    args = ap.parse_args()
    names = list(PRESETS) + ["cnn", "mlp"] if args.model == "all" else [args.model]
    for n in names:
        m = build(n)
        print(f"{n}: {sum(p.numel() for p in m.parameters())} parameters")
        for k, v in m.state_dict().items():
            print(f"  {k}: {list(v.shape)}")


if __name__ == "__main__":
    main()
