#!/usr/bin/python3
"""PyTorch's side of bench/gpu_kernels_bench.cpp: the same gpt2-124m shapes on cuda:0.
GEMMs with torch.matmul (bf16 in, bf16 out, f32 accumulation; f32 with TF32 off), c_fc and its
tanh GELU (F.linear, F.gelu: eager, two kernels), causal
attention with F.scaled_dot_product_attention (forward, and backward through autograd),
LayerNorm. One JSON line per kernel: {"kernel", "dtype", "ms", "tflops"}; CUDA events
around `iters` calls after 3 warm-up calls, median of 5 repetitions.
"""
import json, statistics, sys

import torch
import torch.nn.functional as F

B, T, C, NH, V = 8, 1024, 768, 12, 50257
BT = B * T
GEMMS = [("peak 8192^3", False, False, 8192, 8192, 8192),
         ("c_attn fwd", False, False, BT, 3 * C, C), ("c_attn bwd dx", False, True, BT, C, 3 * C),
         ("c_attn bwd dw", True, False, C, 3 * C, BT), ("c_fc fwd", False, False, BT, 4 * C, C),
         ("c_proj(mlp) fwd", False, False, BT, C, 4 * C), ("lm_head fwd", False, True, BT, V, C),
         ("lm_head bwd dx", False, False, BT, C, V), ("lm_head bwd dw", True, False, V, C, BT)]


def time_ms(f, iters=20, reps=5):
    for _ in range(3):
        f()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(reps):
        a.record()
        for _ in range(iters):
            f()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / iters)
    return statistics.median(ms)


def report(kernel, dtype, ms, flops):
    print(json.dumps({"kernel": kernel, "dtype": dtype, "ms": round(ms, 4),
                      "tflops": round(flops / (ms * 1e-3) / 1e12, 2) if flops else 0.0}), flush=True)


def main():
    if not torch.cuda.is_available():
        print("torch_gpu_kernels.py: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        for kname, ta, tb, M, N, K in GEMMS:
            a = torch.randn((K, M) if ta else (M, K), device="cuda", dtype=dt)
            b = torch.randn((N, K) if tb else (K, N), device="cuda", dtype=dt)
            opa, opb = (a.t() if ta else a), (b.t() if tb else b)
            report("gemm " + kname, name, time_ms(lambda: opa @ opb), 2.0 * M * N * K)
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        x = torch.randn(BT, C, device="cuda", dtype=dt)
        w = torch.randn(4 * C, C, device="cuda", dtype=dt) * 0.02
        bias = torch.randn(4 * C, device="cuda", dtype=dt)
        report("c_fc+gelu fwd", name, time_ms(lambda: F.gelu(F.linear(x, w, bias), approximate="tanh")),
               2.0 * BT * 4 * C * C)
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16"), (torch.float32, "f32")):
        if sdpa is None:
            break
        q, k, v = (torch.randn(B, NH, T, C // NH, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
        fwd_flops = 4.0 * B * NH * T * T * (C // NH) / 2
        report("attention fwd", name, time_ms(lambda: sdpa(q, k, v, is_causal=True)), fwd_flops)
        out = sdpa(q, k, v, is_causal=True)
        dout = torch.randn_like(out)
        ms_b = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        report("attention bwd", name, ms_b, 2.5 * fwd_flops)
    # the tied LM head and its loss as torch_gpu_train.py's GPT runs them under bf16 autocast
    x = torch.randn(BT, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(V, C, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    t = (torch.arange(BT, device="cuda") * 7919) % V

    def head_step():
        F.cross_entropy((x @ w.t()).float(), t).backward()
        x.grad = w.grad = None
    report("lm_head+loss fwd+bwd", "bf16", time_ms(head_step), 3 * 2.0 * BT * V * C)
    x = torch.randn(BT, C, device="cuda")
    ln = torch.nn.LayerNorm(C, eps=1e-5).cuda()
    with torch.no_grad():
        report("layernorm fwd", "f32", time_ms(lambda: ln(x)), 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
