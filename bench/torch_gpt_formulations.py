#!/usr/bin/python3
"""The ways a PyTorch user would write paratrain's GPT, for the benchmark peers.

Every formulation is the same model (GPT-2: pre-LayerNorm blocks, GELU tanh, LayerNorm eps
1e-5, causal attention scaled by 1/sqrt(head dim), LM head tied to wte, mean cross-entropy)
with the same parameters, and loads paratrain's safetensors files through `load_hf_state`
(Hugging Face GPT-2 names; Conv1D weights are [in, out], nn.Linear weights are [out, in]).

  hf              tests/python/models.py: Hugging Face's Conv1D (torch.addmm on [in, out]
                  weights) and masked_fill + softmax attention. The exact reference model.
  linear          nanoGPT's way: nn.Linear ([out, in] weights), F.gelu(approximate="tanh"),
                  attention as q @ k^T, masked_fill, softmax, @ v.
  linear-baddbmm  nn.Linear, and the attention scores as one torch.baddbmm of an additive
                  causal mask (scale and mask in the same kernel as the product).
  sdpa            nn.Linear and F.scaled_dot_product_attention(is_causal=True) (PyTorch 2.0
                  and later; absent from Debian 12's PyTorch 1.13, where it is skipped).

Which one is fastest depends on the PyTorch build and the CPU; `bench/torch_gpt_train.py
--formulation all` measures them side by side and the benchmarks use the fastest one
measured (FASTEST below, with the figures that chose it).
"""
import math
import os
import sys

import torch  # import this module only after the thread variables are set (torch_gpt_train)
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

# Measured on AMD EPYC (Zen 3, AVX2, 2 cores), Debian's PyTorch 1.13, gpt-mini, micro-batch
# 8, 2 threads, tuned as bench/torch_env.sh does, median step after warm-up (two runs of
# `bench/torch_gpt_train.py --formulation all`): hf 916 / 765, linear 836 / 805,
# linear-baddbmm 864 / 822 tokens/s, i.e. within the run-to-run noise of each other on this
# CPU. Measured on a CPU with AVX-512 (issue 9), linear was 1.5x hf. So linear is the default
# here, and `make bench` (bench/train_gpt_mini.sh) races all of them in every run and uses
# the fastest of that run.
FASTEST = "linear"
# The same under torch.autocast("cpu", dtype=torch.bfloat16) (the mixed-precision peer),
# measured at micro-batch 2, 1 thread (PyTorch's CPU bf16 takes about a minute per
# micro-batch-8 step on this AVX2 CPU): hf 36.5, linear 35.8, linear-baddbmm 28.3 tokens/s;
# hf and linear are within noise, hf was the faster.
FASTEST_BF16 = "hf"


def fastest(precision="fp32"):
    return FASTEST_BF16 if precision == "bf16" else FASTEST

NAMES = ("hf", "linear", "linear-baddbmm", "sdpa")


def available(name):
    if name == "sdpa":
        return hasattr(F, "scaled_dot_product_attention")
    return name in NAMES


def build(name, cfg):
    """A GPT of formulation `name` for models.GPTConfig `cfg`, with GPT-2's init."""
    import models
    if name == "hf":
        return models.GPT(cfg)
    if name not in NAMES:
        raise SystemExit(f"error: unknown formulation {name!r} (one of {', '.join(NAMES)}, all)")
    if not available(name):
        raise SystemExit(f"error: formulation {name!r} needs a newer PyTorch than this one")
    return LinearGPT(cfg, attention=name)


def load_hf_state(model, state):
    """Loads a Hugging Face-named GPT-2 state dict (paratrain's files: Conv1D weights
    [in, out]) into a model of any formulation."""
    if not isinstance(model, LinearGPT):
        model.load_state_dict(state, strict=True)
        return
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    with torch.no_grad():
        model.load_state_dict({k: (v.t().contiguous() if k.endswith(conv1d) else v)
                               for k, v in state.items()}, strict=True)


class LinearAttention(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.n_head = cfg.n_head
        self.attention = attention
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        T = cfg.block_size
        # plain attributes, not buffers: DDP would broadcast them (gloo has no bool)
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        self.additive = torch.zeros(T, T).masked_fill(~self.mask, float("-inf"))

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        D = C // H
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.attention == "linear-baddbmm":
            qf = q.reshape(B * H, T, D)
            kf = k.reshape(B * H, T, D)
            att = torch.baddbmm(self.additive[:T, :T].expand(B * H, T, T), qf, kf.transpose(1, 2),
                                beta=1.0, alpha=1.0 / math.sqrt(D))
            att = torch.softmax(att, dim=-1)
            y = torch.bmm(att, v.reshape(B * H, T, D)).view(B, H, T, D)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = torch.softmax(att, dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class LinearMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class LinearBlock(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = LinearAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = LinearMLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class LinearGPT(nn.Module):
    """GPT-2 written with nn.Linear the way nanoGPT does; parameter names are Hugging
    Face's (h.{i}.attn.c_attn.weight, ...), the Linear weights are their transposes."""

    def __init__(self, cfg, attention="linear"):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([LinearBlock(cfg, attention) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        std_proj = 0.02 / math.sqrt(2 * cfg.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("ln") or ".ln_" in name:
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, std_proj if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))[None]
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(B * T, -1).float(), targets.reshape(B * T).long())
        return logits, loss

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


def hf_gradients(model):
    """The model's gradients under Hugging Face names and shapes (Conv1D [in, out])."""
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad.detach()
        grads[n] = g.t().contiguous() if isinstance(model, LinearGPT) and n.endswith(conv1d) else g
    return grads


def main():
    """--weights W --batch B --out OUT: loads paratrain's GPT file W into every available
    formulation, runs forward and backward on B (inputs, targets), and writes OUT with
    loss.<formulation> and grad.<formulation>.<name> (Hugging Face layout) for each, so a
    test can check that every benchmark peer is paratrain's model."""
    import argparse
    import safetensors_np as st
    import models
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--config", default="gpt-nano", help="a preset of tests/python/models.py")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = models.PRESETS[args.config]
    state = {k[len("transformer."):] if k.startswith("transformer.") else k: v
             for k, v in st.load(args.weights).items()}
    batch = st.load(args.batch)
    x, y = batch["inputs"].long(), batch["targets"].long()
    out = {}
    for name in NAMES:
        if not available(name):
            print(f"{name}: not available in PyTorch {torch.__version__}", file=sys.stderr)
            continue
        model = build(name, cfg)
        load_hf_state(model, state)
        _, loss = model(x, y)
        loss.backward()
        out[f"loss.{name}"] = loss.detach().reshape(1)
        for n, g in hf_gradients(model).items():
            out[f"grad.{name}.{n}"] = g
        print(f"{name}: loss {loss.item():.8f}", file=sys.stderr)
    st.save(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
