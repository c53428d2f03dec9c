#!/usr/bin/python3
"""PyTorch oracle for paratrain's tests: loss, gradients and AdamW steps of gpt / cnn / mlp.

Run with Debian's Python (torch 1.13 + numpy): /usr/bin/python3 tests/python/torch_reference.py

Reference mode:
  torch_reference.py --model gpt|cnn|mlp [--config CONFIG.json] --weights INIT.safetensors
      --batch BATCH.safetensors --out OUT.safetensors
      [--steps 10] [--lr 1e-3] [--beta1 0.9] [--beta2 0.95] [--eps 1e-6]
      [--weight-decay 0.1] [--dtype float32|float64] [--threads 1]

  CONFIG.json (gpt only): {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"}
  (other keys ignored); a preset name (gpt-nano, gpt-mini) is accepted instead of a path.
  BATCH: gpt: "inputs" I32 [B,T], "targets" I32 [B,T];
         cnn/mlp: "images" F32 [N,1,28,28], "labels" I32|I64 [N].
  WEIGHTS must hold every parameter with its exact shape (HF GPT-2 names for gpt; a
  'transformer.' prefix is accepted; extra tensors are ignored with a warning).

  It computes the loss and gradients on the batch, then runs --steps steps of
  torch.optim.AdamW on that same batch (two groups: parameters with dim >= 2 decay with
  --weight-decay, the others have weight decay 0; constant lr; no clipping), and writes:
    "loss"          F32 [1]      initial loss
    "grad.<name>"   F32 [shape]  initial gradient of every parameter
    "final.<name>"  F32 [shape]  every parameter after the steps
    "losses"        F32 [steps]  loss at each step, before that step's update
  --dtype float64 runs everything in double (weights and images converted); outputs are
  still written as F32.

Init mode:
  torch_reference.py --init OUT.safetensors --model gpt|cnn|mlp [--config CONFIG.json]
      [--seed 0]
  gpt: GPT-2 init (normal std 0.02, c_proj weights std 0.02/sqrt(2*n_layer), biases 0,
  LayerNorm weight 1 bias 0); cnn/mlp: PyTorch's default init. Written as F32.

Batch mode (random batch for tests):
  torch_reference.py --make-batch OUT.safetensors --model gpt|cnn|mlp [--config C]
      [--batch-size 4] [--seq-len T] [--seed 0]

Self-test:
  torch_reference.py --selftest   checks the safetensors round trip and rejection of bad
  files, the GPT against an independent second implementation (explicit per-head masking),
  the CNN and MLP against unfold/matmul implementations, gradients against finite
  differences (float64) and the AdamW steps against the formula in REFERENCE.md.

Exit codes: 0 ok, 2 bad input (one line on stderr), 1 self-test failure.
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_np as st  # noqa: E402


class BadInput(Exception):
    pass


# ----------------------------------------------------------------------------- helpers

def load_config(model, path):
    if model != "gpt":
        return None
    if path is None:
        raise BadInput("--config is required for --model gpt")
    if path in models.PRESETS:
        return models.PRESETS[path]
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        raise BadInput(f"cannot read config {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise BadInput(f"config {path}: bad JSON: {e}")
    if not isinstance(d, dict):
        raise BadInput(f"config {path}: not a JSON object")
    try:
        return models.GPTConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise BadInput(f"config {path}: {e}")


def build_model(model, cfg):
    if model == "gpt":
        return models.GPT(cfg)
    return models.build(model)


def read_st(path, what):
    try:
        return st.load(path)
    except OSError as e:
        raise BadInput(f"cannot read {what} {path}: {e.strerror}")
    except st.SafetensorsError as e:
        raise BadInput(f"{what}: {e}")


def load_weights(net, path):
    tensors = read_st(path, "weights")
    stripped = {}
    for k, v in tensors.items():
        stripped[k[len("transformer."):] if k.startswith("transformer.") else k] = v
    params = dict(net.named_parameters())
    missing = [n for n in params if n not in stripped]
    if missing:
        raise BadInput(f"weights {path}: missing tensor {missing[0]!r}"
                       + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for n, p in params.items():
        t = stripped[n]
        if tuple(t.shape) != tuple(p.shape):
            raise BadInput(f"weights {path}: tensor {n!r} has shape {list(t.shape)}, "
                           f"expected {list(p.shape)}")
        if not t.is_floating_point():
            raise BadInput(f"weights {path}: tensor {n!r} is not floating point ({t.dtype})")
    extra = [k for k in stripped if k not in params]
    if extra:
        print(f"warning: weights {path}: ignoring {len(extra)} extra tensors "
              f"(e.g. {extra[0]!r})", file=sys.stderr)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(stripped[n].to(p.dtype))


def load_batch(model, path, cfg, dtype):
    b = read_st(path, "batch")
    if model == "gpt":
        for k in ("inputs", "targets"):
            if k not in b:
                raise BadInput(f"batch {path}: missing tensor {k!r}")
            if b[k].dtype not in (torch.int32, torch.int64) or b[k].dim() != 2:
                raise BadInput(f"batch {path}: {k!r} must be I32 [B,T], got "
                               f"{b[k].dtype} {list(b[k].shape)}")
        x, y = b["inputs"].long(), b["targets"].long()
        if x.shape != y.shape:
            raise BadInput(f"batch {path}: inputs {list(x.shape)} and targets "
                           f"{list(y.shape)} differ in shape")
        if x.shape[1] > cfg.block_size or x.shape[1] == 0 or x.shape[0] == 0:
            raise BadInput(f"batch {path}: sequence length {x.shape[1]} not in "
                           f"[1, block_size={cfg.block_size}]")
        for k, t in (("inputs", x), ("targets", y)):
            if t.min() < 0 or t.max() >= cfg.vocab_size:
                raise BadInput(f"batch {path}: {k!r} has tokens outside [0, {cfg.vocab_size})")
        return x, y
    for k in ("images", "labels"):
        if k not in b:
            raise BadInput(f"batch {path}: missing tensor {k!r}")
    x, y = b["images"], b["labels"]
    if not x.is_floating_point() or x.dim() != 4 or tuple(x.shape[1:]) != (1, 28, 28):
        raise BadInput(f"batch {path}: 'images' must be F32 [N,1,28,28], got "
                       f"{x.dtype} {list(x.shape)}")
    if y.dtype not in (torch.int32, torch.int64) or y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise BadInput(f"batch {path}: 'labels' must be I32/I64 [N] with N={x.shape[0]}, "
                       f"got {y.dtype} {list(y.shape)}")
    if y.min() < 0 or y.max() > 9:
        raise BadInput(f"batch {path}: 'labels' outside [0, 10)")
    return x.to(dtype), y.long()


def make_optimizer(net, lr, beta1, beta2, eps, weight_decay):
    decay = [p for p in net.parameters() if p.dim() >= 2]
    no_decay = [p for p in net.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps,
                             foreach=False)


def run_reference(net, x, y, steps, lr, beta1, beta2, eps, weight_decay, autocast=None):
    """Returns (loss0, grads0 dict, final params dict, losses list). autocast: None, or a
    dtype for torch.autocast("cpu") around every forward."""
    import contextlib
    opt = make_optimizer(net, lr, beta1, beta2, eps, weight_decay)

    def forward():
        ctx = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ctx:
            return net(x, y)
    net.zero_grad(set_to_none=True)
    _, loss = forward()
    loss.backward()
    loss0 = loss.item()
    grads0 = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
    losses = []
    for s in range(steps):
        if s > 0:
            net.zero_grad(set_to_none=True)
            _, loss = forward()
            loss.backward()
        losses.append(loss.item())
        opt.step()
    final = {n: p.detach().clone() for n, p in net.named_parameters()}
    return loss0, grads0, final, losses


def f32(t):
    return t.detach().to(torch.float32).contiguous()


# ----------------------------------------------------------------------------- modes

def cmd_reference(args):
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    for need in ("weights", "batch", "out"):
        if getattr(args, need) is None:
            raise BadInput(f"--{need} is required")
    if args.steps < 0:
        raise BadInput("--steps must be >= 0")
    cfg = load_config(args.model, args.config)
    torch.manual_seed(0)
    net = build_model(args.model, cfg)
    load_weights(net, args.weights)
    net.to(dtype)
    x, y = load_batch(args.model, args.batch, cfg, dtype)
    autocast = {"none": None, "bf16": torch.bfloat16}[args.autocast]
    loss0, grads0, final, losses = run_reference(
        net, x, y, args.steps, args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, autocast)
    out = {"loss": torch.tensor([loss0], dtype=torch.float32),
           "losses": torch.tensor(losses, dtype=torch.float32)}
    for n in grads0:
        out["grad." + n] = f32(grads0[n])
        out["final." + n] = f32(final[n])
    meta = {"model": args.model, "dtype": args.dtype, "steps": str(args.steps),
            "lr": repr(args.lr), "beta1": repr(args.beta1), "beta2": repr(args.beta2),
            "eps": repr(args.eps), "weight_decay": repr(args.weight_decay),
            "loss": repr(loss0), "torch": torch.__version__, "autocast": args.autocast}
    if cfg is not None:
        meta["config"] = json.dumps(cfg.to_dict())
    st.save(args.out, out, metadata=meta)
    print(f"loss {loss0:.8f}  last step loss {losses[-1] if losses else float('nan'):.8f}  "
          f"-> {args.out}")


def init_model(model, cfg, seed):
    torch.manual_seed(seed)
    net = build_model(model, cfg)  # cnn/mlp: torch default init under this seed
    if model == "gpt":
        g = torch.Generator().manual_seed(seed)
        net.init_weights(generator=g)
    return net


def cmd_init(args):
    cfg = load_config(args.model, args.config)
    net = init_model(args.model, cfg, args.seed)
    meta = {"model": args.model, "seed": str(args.seed), "torch": torch.__version__}
    if cfg is not None:
        meta["config"] = json.dumps(cfg.to_dict())
    st.save(args.init, {n: f32(p) for n, p in net.named_parameters()}, metadata=meta)
    print(f"wrote {sum(p.numel() for p in net.parameters())} parameters -> {args.init}")


def make_batch(model, cfg, batch_size, seq_len, seed):
    g = torch.Generator().manual_seed(seed)
    if model == "gpt":
        T = seq_len or cfg.block_size
        if T > cfg.block_size:
            raise BadInput(f"--seq-len {T} > block_size {cfg.block_size}")
        toks = torch.randint(0, cfg.vocab_size, (batch_size, T + 1), generator=g)
        return {"inputs": toks[:, :-1].to(torch.int32).contiguous(),
                "targets": toks[:, 1:].to(torch.int32).contiguous()}
    return {"images": torch.rand(batch_size, 1, 28, 28, generator=g),
            "labels": torch.randint(0, 10, (batch_size,), generator=g).to(torch.int32)}


def cmd_make_batch(args):
    cfg = load_config(args.model, args.config)
    b = make_batch(args.model, cfg, args.batch_size, args.seq_len, args.seed)
    st.save(args.make_batch, b)
    print(f"wrote batch {', '.join(f'{k} {list(v.shape)}' for k, v in b.items())} "
          f"-> {args.make_batch}")


# ----------------------------------------------------------------------------- self-test

class SelfTestFailure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise SelfTestFailure(what)
    print(f"  ok  {what}")


def relerr(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def gpt_forward_independent(sd, cfg, idx, targets):
    """Second GPT implementation: functional ops, per-head loop, additive -inf mask."""
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    D = C // H
    x = sd["wte.weight"][idx] + sd["wpe.weight"][:T].unsqueeze(0)
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    for i in range(cfg.n_layer):
        p = lambda s: sd[f"h.{i}.{s}"]  # noqa: E731
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), 1e-5)
        qkv = F.linear(h, p("attn.c_attn.weight").t(), p("attn.c_attn.bias"))
        heads = []
        for hd in range(H):
            q = qkv[..., 0 * C + hd * D: 0 * C + (hd + 1) * D]
            k = qkv[..., 1 * C + hd * D: 1 * C + (hd + 1) * D]
            v = qkv[..., 2 * C + hd * D: 2 * C + (hd + 1) * D]
            s = torch.einsum("btd,bsd->bts", q, k) / math.sqrt(D) + mask
            heads.append(torch.einsum("bts,bsd->btd", F.softmax(s, dim=-1), v))
        a = torch.cat(heads, dim=-1)
        x = x + F.linear(a, p("attn.c_proj.weight").t(), p("attn.c_proj.bias"))
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), 1e-5)
        h = F.linear(h, p("mlp.c_fc.weight").t(), p("mlp.c_fc.bias"))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + F.linear(h, p("mlp.c_proj.weight").t(), p("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), sd["ln_f.weight"], sd["ln_f.bias"], 1e-5)
    logits = F.linear(x, sd["wte.weight"])
    logp = logits - logits.logsumexp(-1, keepdim=True)
    loss = -logp.gather(-1, targets.unsqueeze(-1)).mean()
    return logits, loss


def conv_unfold(x, w, b):
    N, _, Hh, Ww = x.shape
    cols = F.unfold(x, 3, padding=1)  # [N, Cin*9, H*W]
    y = w.reshape(w.shape[0], -1) @ cols + b[None, :, None]
    return y.view(N, w.shape[0], Hh, Ww)


def pool_2x2(x):
    N, Cc, Hh, Ww = x.shape
    return x.view(N, Cc, Hh // 2, 2, Ww // 2, 2).amax(dim=(3, 5))


def cnn_forward_independent(sd, x, y):
    h = pool_2x2(conv_unfold(x, sd["conv1.weight"], sd["conv1.bias"]).clamp_min(0))
    h = pool_2x2(conv_unfold(h, sd["conv2.weight"], sd["conv2.bias"]).clamp_min(0))
    h = h.reshape(h.shape[0], -1)
    h = (h @ sd["fc1.weight"].t() + sd["fc1.bias"]).clamp_min(0)
    logits = h @ sd["fc2.weight"].t() + sd["fc2.bias"]
    return logits, -(logits - logits.logsumexp(-1, keepdim=True)).gather(1, y[:, None]).mean()


def mlp_forward_independent(sd, x, y):
    h = x.reshape(x.shape[0], -1)
    h = (h @ sd["fc1.weight"].t() + sd["fc1.bias"]).clamp_min(0)
    h = (h @ sd["fc2.weight"].t() + sd["fc2.bias"]).clamp_min(0)
    logits = h @ sd["fc3.weight"].t() + sd["fc3.bias"]
    return logits, -(logits - logits.logsumexp(-1, keepdim=True)).gather(1, y[:, None]).mean()


def adamw_manual(params, grads_fn, steps, lr, b1, b2, eps, wd):
    """AdamW exactly as REFERENCE.md writes it; weight decay on dim >= 2 only."""
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    for t in range(1, steps + 1):
        g = grads_fn(params)
        for n, p in params.items():
            d = wd if p.dim() >= 2 else 0.0
            p = p * (1 - lr * d)
            m[n] = b1 * m[n] + (1 - b1) * g[n]
            v[n] = b2 * v[n] + (1 - b2) * g[n] ** 2
            denom = v[n].sqrt() / math.sqrt(1 - b2 ** t) + eps
            params[n] = p - (lr / (1 - b1 ** t)) * m[n] / denom
    return params


def selftest_safetensors(tmp):
    print("safetensors:")
    g = torch.Generator().manual_seed(1)
    t = {
        "f32": torch.randn(3, 5, generator=g),
        "f64": torch.randn(7, generator=g, dtype=torch.float64),
        "f16": torch.randn(2, 3, 4, generator=g).half(),
        "bf16": torch.randn(9, 2, generator=g).bfloat16(),
        "i32": torch.randint(-2**31, 2**31 - 1, (6,), generator=g, dtype=torch.int64).int(),
        "i64": torch.randint(-2**62, 2**62, (2, 2), generator=g, dtype=torch.int64),
        "u8": torch.randint(0, 256, (11,), generator=g).to(torch.uint8),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "a.b.c": torch.arange(5, dtype=torch.float32),
    }
    u16 = np.array([0, 1, 40000, 65535], dtype=np.uint16)
    path = os.path.join(tmp, "rt.safetensors")
    st.save(path, dict(t, u16=u16), metadata={"format": "pt", "k": "v"})
    back, meta = st.load_with_metadata(path)
    check(meta == {"format": "pt", "k": "v"}, "metadata round trip")
    check(set(back) == set(t) | {"u16"}, "all names read back")
    for k, v in t.items():
        check(back[k].dtype == v.dtype and back[k].shape == v.shape
              and torch.equal(back[k].view(-1).view(torch.uint8) if v.numel() else back[k],
                              v.view(-1).view(torch.uint8) if v.numel() else v),
              f"{k}: {v.dtype} {list(v.shape)} bit-exact")
    check(back["u16"].tolist() == u16.tolist(), "u16 values (read as int32)")
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    check((8 + n) % 8 == 0, "data section 8-byte aligned")
    hdr = json.loads(raw[8:8 + n])
    names = [k for k in hdr if k != "__metadata__"]
    offs = [hdr[k]["data_offsets"] for k in names]
    check(names == sorted(names) and offs == sorted(offs), "tensors written sorted by name")
    check(all(a[1] == b[0] for a, b in zip(offs, offs[1:])) and offs[0][0] == 0
          and offs[-1][1] == len(raw) - 8 - n, "tensors packed without gaps")
    check(hdr["bf16"]["dtype"] == "BF16" and hdr["u16"]["dtype"] == "U16"
          and hdr["f16"]["dtype"] == "F16", "dtype tags")
    # bf16 bits: 1.0 is 0x3f80
    bits = st.load_np(path)["bf16"]
    check(bits.dtype == np.uint16 and
          np.array_equal(bits, t["bf16"].view(torch.int16).numpy().view(np.uint16)),
          "bf16 stored as raw uint16 bits")

    def corrupt(name, mutate):
        h = json.loads(raw[8:8 + n])
        mutate(h)
        js = json.dumps(h).encode()
        js += b" " * ((8 - (8 + len(js)) % 8) % 8)
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(len(js).to_bytes(8, "little") + js + raw[8 + n:])
        try:
            st.load(p)
        except st.SafetensorsError as e:
            check(True, f"rejects {name}: {e}")
            return
        raise SelfTestFailure(f"accepted a bad file: {name}")

    corrupt("overlap", lambda h: h["f32"].__setitem__(
        "data_offsets", [h["f32"]["data_offsets"][0] - 4, h["f32"]["data_offsets"][1] - 4]))
    corrupt("out-of-range", lambda h: h["u8"].__setitem__(
        "data_offsets", [10**9, 10**9 + 11]))
    corrupt("size-mismatch", lambda h: h["f32"].__setitem__("shape", [3, 6]))
    corrupt("bad-dtype", lambda h: h["f32"].__setitem__("dtype", "F8"))
    p = os.path.join(tmp, "long-header")
    with open(p, "wb") as f:
        f.write((len(raw) * 2).to_bytes(8, "little") + raw[8:])
    try:
        st.load(p)
        raise SelfTestFailure("accepted a header longer than the file")
    except st.SafetensorsError as e:
        check(True, f"rejects header longer than the file: {e}")


def selftest_models(tmp, args):
    print("models:")
    cfg = models.PRESETS["gpt-nano"]
    net = init_model("gpt", cfg, 1234)
    sd = net.state_dict()
    expect = {"wte.weight": [256, 64], "wpe.weight": [64, 64], "ln_f.weight": [64],
              "h.1.attn.c_attn.weight": [64, 192], "h.1.attn.c_attn.bias": [192],
              "h.1.attn.c_proj.weight": [64, 64], "h.0.mlp.c_fc.weight": [64, 256],
              "h.0.mlp.c_proj.weight": [256, 64], "h.0.ln_2.bias": [64]}
    check(all(list(sd[k].shape) == v for k, v in expect.items())
          and len(sd) == 4 + 12 * cfg.n_layer
          and not any(k.startswith("transformer.") or k.startswith("lm_head") for k in sd),
          f"gpt-nano state_dict: {len(sd)} HF-named tensors with HF shapes")
    std = sd["h.0.attn.c_proj.weight"].std().item()
    check(abs(std - 0.02 / math.sqrt(4)) < 0.002 and abs(sd["wte.weight"].std() - 0.02) < 0.002
          and sd["h.0.ln_1.weight"].eq(1).all() and sd["h.0.attn.c_attn.bias"].eq(0).all(),
          f"GPT-2 init (c_proj std {std:.5f})")
    check(torch.equal(init_model("gpt", cfg, 1234).state_dict()["wte.weight"],
                      sd["wte.weight"]), "init is reproducible from the seed")
    # safetensors round trip of model weights
    wpath = os.path.join(tmp, "w.safetensors")
    st.save(wpath, {n: p for n, p in net.named_parameters()})
    net2 = models.GPT(cfg)
    load_weights(net2, wpath)
    check(all(torch.equal(a, b) for a, b in zip(net.parameters(), net2.parameters())),
          "gpt-nano weights round trip through safetensors bit-exact")

    # logits: reference vs independent implementation, f32 and f64
    b = make_batch("gpt", cfg, 3, 64, 7)
    x, y = b["inputs"].long(), b["targets"].long()
    with torch.no_grad():
        # larger random weights so the attention pattern is far from uniform
        for n, p in net.named_parameters():
            if not n.endswith("ln_1.weight") and not n.endswith("ln_2.weight") \
                    and n != "ln_f.weight":
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n)))
                       * 0.1)
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        net.to(dt)
        sd = {k: v for k, v in net.state_dict().items()}
        with torch.no_grad():
            l1, loss1 = net(x, y)
            l2, loss2 = gpt_forward_independent(sd, cfg, x, y)
        e = relerr(l1, l2)
        el = abs(loss1.item() - loss2.item()) / abs(loss2.item())
        check(e < tol and el < tol,
              f"gpt-nano {dt}: logits rel err {e:.2e}, loss rel err {el:.2e} (< {tol})")
    # gradients: reference vs independent implementation (autograd through both), f64
    net.double()
    net.zero_grad()
    _, loss = net(x, y)
    loss.backward()
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in net.state_dict().items()}
    _, loss2 = gpt_forward_independent(sd, cfg, x, y)
    loss2.backward()
    worst = max(relerr(p.grad, sd[n].grad) for n, p in net.named_parameters())
    check(worst < 1e-10, f"gpt-nano f64 gradients vs independent impl: worst rel err {worst:.2e}")
    # finite differences along a random direction
    g = torch.Generator().manual_seed(3)
    dirs = {n: torch.randn(p.shape, generator=g, dtype=torch.float64)
            for n, p in net.named_parameters()}
    analytic = sum((p.grad * dirs[n]).sum() for n, p in net.named_parameters()).item()
    h = 1e-5
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.add_(h * dirs[n])
        lp = net(x, y)[1].item()
        for n, p in net.named_parameters():
            p.sub_(2 * h * dirs[n])
        lm = net(x, y)[1].item()
        for n, p in net.named_parameters():
            p.add_(h * dirs[n])
    fd = (lp - lm) / (2 * h)
    check(abs(fd - analytic) / abs(analytic) < 1e-6,
          f"gpt-nano directional derivative: analytic {analytic:.8f} vs fd {fd:.8f}")

    # CNN and MLP vs unfold/matmul implementations
    for name, indep in (("cnn", cnn_forward_independent), ("mlp", mlp_forward_independent)):
        m = init_model(name, None, 5).double()
        bb = make_batch(name, None, 6, None, 8)
        xi, yi = bb["images"].double(), bb["labels"].long()
        m.zero_grad()
        l1, loss1 = m(xi, yi)
        loss1.backward()
        sd = {k: v.detach().clone().requires_grad_(True) for k, v in m.state_dict().items()}
        l2, loss2 = indep(sd, xi, yi)
        loss2.backward()
        e = relerr(l1, l2)
        ge = max(relerr(p.grad, sd[n].grad) for n, p in m.named_parameters())
        check(e < 1e-12 and ge < 1e-10,
              f"{name} f64 logits rel err {e:.2e}, worst grad rel err {ge:.2e}")
        shapes = {k: list(v.shape) for k, v in m.state_dict().items()}
        if name == "cnn":
            check(shapes == {"conv1.weight": [32, 1, 3, 3], "conv1.bias": [32],
                             "conv2.weight": [64, 32, 3, 3], "conv2.bias": [64],
                             "fc1.weight": [128, 3136], "fc1.bias": [128],
                             "fc2.weight": [10, 128], "fc2.bias": [10]}, "cnn names and shapes")
        else:
            check(shapes == {"fc1.weight": [256, 784], "fc1.bias": [256],
                             "fc2.weight": [256, 256], "fc2.bias": [256],
                             "fc3.weight": [10, 256], "fc3.bias": [10]}, "mlp names and shapes")

    # AdamW: torch steps vs the REFERENCE.md formula (f64), CNN (4-D weights decay too)
    m = init_model("cnn", None, 9).double()
    bb = make_batch("cnn", None, 4, None, 10)
    xi, yi = bb["images"].double(), bb["labels"].long()
    start = {n: p.detach().clone() for n, p in m.named_parameters()}
    hp = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1)
    _, _, final, losses = run_reference(m, xi, yi, 5, **hp)

    def grads_fn(params):
        ps = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
        _, loss = cnn_forward_independent(ps, xi, yi)
        loss.backward()
        return {n: p.grad for n, p in ps.items()}

    manual = adamw_manual(dict(start), grads_fn, 5, hp["lr"], hp["beta1"], hp["beta2"],
                          hp["eps"], hp["weight_decay"])
    worst = max(relerr(final[n] - start[n], manual[n] - start[n]) for n in start)
    check(worst < 1e-8 and losses[-1] < losses[0],
          f"AdamW 5 steps vs formula: worst rel err of the update {worst:.2e}; "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")

    # end to end through the command line mode, gpt-nano, f32 and f64
    cpath = os.path.join(tmp, "cfg.json")
    with open(cpath, "w") as f:
        json.dump(cfg.to_dict(), f)
    ipath, bpath = os.path.join(tmp, "init.safetensors"), os.path.join(tmp, "batch.safetensors")
    cmd_init(argparse.Namespace(init=ipath, model="gpt", config=cpath, seed=0))
    cmd_make_batch(argparse.Namespace(make_batch=bpath, model="gpt", config=cpath,
                                      batch_size=4, seq_len=64, seed=0))
    outs = {}
    for dt in ("float32", "float64"):
        op = os.path.join(tmp, f"out_{dt}.safetensors")
        cmd_reference(argparse.Namespace(
            model="gpt", config=cpath, weights=ipath, batch=bpath, out=op, steps=10,
            lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1, dtype=dt))
        outs[dt] = st.load(op)
    o32, o64 = outs["float32"], outs["float64"]
    pn = [n for n, _ in models.GPT(cfg).named_parameters()]
    want = {"loss", "losses"} | {"grad." + n for n in pn} | {"final." + n for n in pn}
    check(set(o32) == want and o32["losses"].shape == (10,)
          and all(v.dtype == torch.float32 for v in o32.values()),
          f"output file: {len(want)} F32 tensors (loss, losses, grad.*, final.*)")
    check(abs(o32["loss"].item() - math.log(256)) < 0.05,
          f"initial loss {o32['loss'].item():.4f} ~ ln(256) = {math.log(256):.4f}")
    # relative to each tensor's largest entry; the key third of c_attn.bias has an exactly
    # zero gradient (softmax is shift invariant) and is compared in absolute terms below
    gl = max(relerr(o32["grad." + n], o64["grad." + n]) for n in pn)
    kb = max(o32[f"grad.h.{i}.attn.c_attn.bias"][cfg.n_embd:2 * cfg.n_embd].abs().max().item()
             for i in range(cfg.n_layer))
    check(kb < 1e-7, f"key-bias gradient is rounding noise only (max |g| {kb:.1e})")
    fl = max(relerr(o32["final." + n], o64["final." + n]) for n in pn)
    check(gl < 1e-4 and fl < 1e-4,
          f"gpt-nano f32 vs f64: grads worst rel err {gl:.2e}, "
          f"10-step weights {fl:.2e}")


def cmd_selftest(args):
    with tempfile.TemporaryDirectory() as tmp:
        selftest_safetensors(tmp)
        selftest_models(tmp, args)
    print("selftest passed")


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="PyTorch reference (loss, gradients, AdamW steps) for paratrain tests.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", choices=["gpt", "cnn", "mlp"], help="model kind")
    ap.add_argument("--config", help="GPT config JSON (or a preset name: gpt-nano, gpt-mini)")
    ap.add_argument("--weights", help="initial weights (safetensors)")
    ap.add_argument("--batch", help="batch (safetensors)")
    ap.add_argument("--out", help="output safetensors")
    ap.add_argument("--steps", type=int, default=10, help="AdamW steps on the batch")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--weight-decay", type=float, default=0.1,
                    help="applied to parameters with dim >= 2 only")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="run every forward under torch.autocast('cpu', dtype) (CPU autocast policy)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--init", metavar="OUT", help="write initial weights to OUT and exit")
    ap.add_argument("--seed", type=int, default=0, help="seed for --init / --make-batch")
    ap.add_argument("--make-batch", metavar="OUT", help="write a random batch to OUT and exit")
    ap.add_argument("--batch-size", type=int, default=4, help="for --make-batch")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="for --make-batch (gpt; default block_size)")
    ap.add_argument("--selftest", action="store_true", help="check the reference itself")
    args = ap.parse_args(argv)
    if not args.selftest and args.model is None:
        ap.error("--model is required")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    try:
        if args.selftest:
            cmd_selftest(args)
        elif args.init:
            cmd_init(args)
        elif args.make_batch:
            cmd_make_batch(args)
        else:
            cmd_reference(args)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SelfTestFailure as e:
        print(f"SELFTEST FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
