#!/usr/bin/python3
"""PyTorch's side of bench/gpu_check.sh: the GPT paratrain trains (same architecture:
GPT-2 with tied LM head, tanh GELU, LayerNorm eps 1e-5), on CUDA, bf16 autocast, attention
through F.scaled_dot_product_attention(is_causal=True), AdamW (fused), random tokens.

Prints one JSON line:
  {"impl": "pytorch", "model": ..., "gpus": N, "tokens_per_s": ..., "step_ms": ...,
   "mfu": ..., "peak_tflops": ..., "peak_mem_bytes": ...}
  tokens_per_s   global tokens per optimizer step (micro_batch * block_size * N) / median
                 step time of the timed steps (torch.cuda.synchronize around each step)
  mfu            flops_per_token * tokens_per_s / (N * peak), flops_per_token = 6 * N_params
                 (without wpe) + 12 * n_layer * n_embd * block_size (nanoGPT/PaLM)
  peak_tflops    measured bf16 GEMM peak of this GPU (torch.matmul 8192^3), or --peak-tflops
  peak_mem_bytes torch.cuda.max_memory_allocated() of rank 0
With --nproc N > 1 it runs DDP over NCCL with N processes, one GPU each.

Usage: torch_gpu_train.py --model gpt2-124m --steps 100 --micro-batch 8 [--nproc N]
"""
import argparse, json, os, statistics, sys, time

PRESETS = {"gpt-nano": (2, 2, 64, 64, 256), "gpt-mini": (6, 6, 384, 256, 4096),
           "gpt2-124m": (12, 12, 768, 1024, 50257)}


def build(torch, L, NH, C, T, V):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T_, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # torch < 2.0 (Debian 12's 1.13): the same math, unfused
                att = (q @ k.transpose(-2, -1)) * (1.0 / (C // NH) ** 0.5)
                mask = torch.ones(T_, T_, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            for name, p in self.named_parameters():  # GPT-2's init, as paratrain's
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))

    return GPT()


def gemm_peak_tflops(torch):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192 ** 3 * 20 / (time.perf_counter() - t0) / 1e12


def run(rank, args, world, out_q):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    L, NH, C, T, V = PRESETS[args.model]
    model = build(torch, L, NH, C, T, V).cuda()
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    g = torch.Generator(device="cuda").manual_seed(args.seed + rank)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, V, (args.micro_batch, T + 1), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        step_s = statistics.median(times)
        tokens = args.micro_batch * T * world
        peak = args.peak_tflops or gemm_peak_tflops(torch)
        fpt = 6 * n_params + 12 * L * C * T
        tps = tokens / step_s
        out_q.put({"impl": "pytorch", "model": args.model, "gpus": world, "micro_batch": args.micro_batch,
                   "tokens_per_s": round(tps, 1), "step_ms": round(step_s * 1e3, 3),
                   "mfu": round(fpt * tps / (world * peak * 1e12), 4), "peak_tflops": round(peak, 1),
                   "peak_mem_bytes": torch.cuda.max_memory_allocated(), "loss": float(loss.detach()),
                   "attention": "sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "unfused",
                   "torch": torch.__version__})
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp
    if not torch.cuda.is_available():
        print("torch_gpu_train.py: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    if args.nproc == 1:
        run(0, args, 1, q)
    else:
        procs = [ctx.Process(target=run, args=(r, args, args.nproc, q)) for r in range(args.nproc)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            print("torch_gpu_train.py: a rank failed", file=sys.stderr)
            return 1
    print(json.dumps(q.get()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
