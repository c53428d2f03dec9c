#!/usr/bin/python3
"""PyTorch baseline for paratrain's training benchmark: GPT (gpt-mini by default), f32, AdamW.

Trains paratrain's GPT (same architecture, parameter names and init) written the fastest way
measured here (bench/torch_gpt_formulations.py; --formulation picks another, `all` measures
each in its own process and prints a table). Warm-up runs at least --warmup-steps untimed
steps and goes on until a step takes no more than --steady-faults minor page faults (PyTorch
here touches fresh memory for about 6 steps) or --max-warmup-steps have run; then --steps
timed steps. Prints one JSON line:

  {"impl": "pytorch", "model": ..., "tokens_per_s": ..., "step_ms": ..., "peak_rss_bytes": ...,
   "threads": ..., "flops_per_token": ..., "gflops": ..., ...}

  tokens_per_s     micro_batch * grad_accum * block_size tokens per optimizer step divided by
                   the median wall time of a timed step (time.perf_counter).
  step_ms          median wall time of one timed optimizer step (zero_grad, forward, backward,
                   AdamW step), in milliseconds; step_ms_min, step_ms_max, step_ms_mean and
                   step_ms_all (every timed step) give the spread.
  warmup_steps_run the untimed steps it took to reach steady state; page_faults_per_step the
                   minor page faults of each timed step.
  peak_rss_bytes   resource.getrusage(RUSAGE_SELF).ru_maxrss * 1024 (Linux reports KiB): the
                   process's peak resident set over its whole life, interpreter and torch
                   libraries included.
  flops_per_token  6*N + 12*n_layer*n_embd*block_size (the PaLM / nanoGPT formula), where
                   N counts every parameter that takes part in a matmul: all parameters but
                   wpe, with the tied wte counted once for the LM head (its 6*V*C per token).
                   The attention term is not halved for the causal mask. (Halving it,
                   6*n_layer*n_embd*block_size, gives 4.4% less for gpt-mini.)
  gflops           flops_per_token * tokens_per_s / 1e9.

Optimizer: torch.optim.AdamW lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the
parameters with dim >= 2 only, constant lr, no clipping.

Data: random tokens (seeded) or --data FILE.bin in the llm.c format (256 int32 header:
magic 20240520, version 1, token count; then uint16 tokens). Windows of block_size+1
tokens with stride block_size, a seeded permutation of them; step s takes windows
perm[s*G, (s+1)*G), G = micro_batch * grad_accum (* world size under DDP).

Threads: torch.set_num_threads(--threads) and OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set to
the same number before torch is imported (Debian's torch calls the pthread OpenBLAS, whose
pool otherwise takes every core).

For PyTorch at its best, run under bench/torch_env.sh (OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE
unset, glibc malloc told not to return memory to the OS):
  bench/torch_env.sh /usr/bin/python3 bench/torch_gpt_train.py --threads 2
"""
import argparse
import json
import math
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

ENV_KEYS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "GLIBC_TUNABLES", "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS")


def set_thread_env(threads):
    """Must run before torch is imported."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)


def add_common_args(ap):
    ap.add_argument("--preset", default="gpt-mini", help="gpt-nano | gpt-mini | gpt2-124m")
    ap.add_argument("--n-layer", type=int)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--n-embd", type=int)
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-step (per rank)")
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    ap.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    ap.add_argument("--warmup-steps", type=int, default=3, help="least untimed steps before timing")
    ap.add_argument("--max-warmup-steps", type=int, default=20,
                    help="most untimed steps while waiting for steady state")
    ap.add_argument("--steady-faults", type=int, default=200,
                    help="a step with at most this many minor page faults is quiet")
    ap.add_argument("--steady-steps", type=int, default=2,
                    help="warm-up ends after this many quiet steps in a row")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="bf16: forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--formulation", default=None,
                    help="model formulation (bench/torch_gpt_formulations.py; default: the fastest measured)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1, help="2-D+ parameters only")
    ap.add_argument("--data", help="llm.c .bin token file (default: random tokens)")
    ap.add_argument("--seed", type=int, default=0)


def gpt_config(args):
    import models
    if args.preset not in models.PRESETS:
        raise SystemExit(f"error: unknown preset {args.preset!r}")
    d = models.PRESETS[args.preset].to_dict()
    for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
        v = getattr(args, k)
        if v is not None:
            d[k] = v
    return models.GPTConfig.from_dict(d)


def read_llmc_tokens(path, vocab_size):
    import numpy as np
    try:
        hdr = np.fromfile(path, dtype="<i4", count=256)
    except OSError as e:
        raise SystemExit(f"error: cannot read {path}: {e.strerror}")
    if hdr.size < 256 or hdr[0] != 20240520 or hdr[1] != 1:
        raise SystemExit(f"error: {path}: not an llm.c token file (magic/version)")
    n = int(hdr[2])
    toks = np.memmap(path, dtype="<u2", mode="r", offset=1024)
    if toks.size < n:
        raise SystemExit(f"error: {path}: truncated ({toks.size} of {n} tokens)")
    toks = toks[:n]
    if n and int(toks.max()) >= vocab_size:
        raise SystemExit(f"error: {path}: token {int(toks.max())} >= vocab_size {vocab_size}")
    return toks


class Batches:
    """Global batches of windows as DESIGN.md's data order: windows of T+1 tokens, stride T,
    a seeded permutation; step s uses perm[s*G, (s+1)*G); slice j = k*dp + r goes to rank r,
    micro-step k."""

    def __init__(self, cfg, micro_batch, grad_accum, world, total_steps, data, seed):
        import numpy as np
        import torch
        self.T = cfg.block_size
        self.B = micro_batch
        self.K = grad_accum
        self.world = world
        self.G = micro_batch * grad_accum * world
        if data is None:
            rng = np.random.default_rng(seed)
            n = self.G * total_steps * self.T + 1
            data = rng.integers(0, cfg.vocab_size, size=n, dtype=np.int64).astype(np.uint16)
        self.tokens = data
        self.nwin = (len(data) - 1) // self.T
        if self.nwin < self.G:
            raise SystemExit(f"error: {self.nwin} windows of {self.T + 1} tokens, "
                             f"fewer than a global batch of {self.G}")
        self.seed = seed
        self.epoch = -1
        self.torch = torch
        self.np = np

    def _perm(self, epoch):
        g = self.torch.Generator().manual_seed(self.seed * 1000003 + epoch)
        return self.torch.randperm(self.nwin, generator=g).numpy()

    def micro(self, step, k, rank):
        """(inputs, targets) int64 [B, T] for optimizer step `step`, micro-step k, rank."""
        per_epoch = self.nwin // self.G
        epoch, s = divmod(step, per_epoch)
        if epoch != self.epoch:
            self.perm, self.epoch = self._perm(epoch), epoch
        j = k * self.world + rank
        wins = self.perm[s * self.G + j * self.B: s * self.G + (j + 1) * self.B]
        T = self.T
        arr = self.np.stack([self.np.asarray(self.tokens[w * T: w * T + T + 1], dtype=self.np.int64)
                             for w in wins])
        t = self.torch.from_numpy(arr)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def make_optimizer(torch, model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)


def flops_per_token(model):
    cfg = model.config
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()  # tied wte counted once (LM head)
    return 6 * n + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def autocast_scope(torch, precision):
    """A context factory: torch's CPU autocast in bf16, or nothing in fp32."""
    import contextlib
    if precision == "bf16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def step_stats(step_s):
    """Median, min, max and mean of the timed steps (seconds), in ms."""
    v = sorted(step_s)
    n = len(v)
    med = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    return {"step_ms": round(med * 1e3, 3), "step_ms_min": round(v[0] * 1e3, 3),
            "step_ms_max": round(v[-1] * 1e3, 3), "step_ms_mean": round(sum(v) / n * 1e3, 3),
            "step_ms_all": [round(x * 1e3, 3) for x in step_s]}


def run_steps(args, one_step, faults=minor_faults):
    """Warm-up until steady state, then args.steps timed steps of one_step(step) -> loss.
    Steady state: at least args.warmup_steps steps, the last args.steady_steps of them each
    with at most args.steady_faults minor page faults (at most args.max_warmup_steps in all).
    faults() counts page faults so far (under DDP the largest over the ranks, so every rank
    ends warm-up at the same step). Returns (losses, timed step seconds, warm-up steps run,
    page faults per timed step)."""
    losses, timed, per_step = [], [], []
    step = 0
    warm = 0
    quiet = 0  # consecutive warm-up steps under the fault threshold
    while True:
        f0 = faults()
        losses.append(one_step(step))
        step += 1
        warm += 1
        quiet = quiet + 1 if faults() - f0 <= args.steady_faults else 0
        if warm >= args.max_warmup_steps or (warm >= args.warmup_steps and quiet >= args.steady_steps):
            break
    for _ in range(args.steps):
        f0 = minor_faults()
        t0 = time.perf_counter()
        losses.append(one_step(step))
        timed.append(time.perf_counter() - t0)
        per_step.append(minor_faults() - f0)
        step += 1
    return losses, timed, warm, per_step


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def env_report():
    return {k: os.environ.get(k) for k in ENV_KEYS}


def compare_formulations(args):
    """--formulation all: every available formulation in its own process, --rounds rounds
    interleaved (so a change in the machine's load hits all alike); prints each one's median
    tokens/s per round and the fastest, then the fastest's JSON line as the result."""
    import subprocess
    set_thread_env(args.threads)
    import torch_gpt_formulations as forms
    names = [n for n in forms.NAMES if forms.available(n)]
    skipped = [n for n in forms.NAMES if n not in names]
    argv = [a for a in sys.argv[1:]]
    i = argv.index("--formulation")
    del argv[i:i + 2]
    results = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--formulation", n],
                                 check=True, capture_output=True, text=True).stdout
            results[n].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'formulation':16}" + "".join(f"{'round ' + str(r + 1):>10}" for r in range(args.rounds))
          + f"{'best':>10}   (tokens/s, median step)", file=sys.stderr)
    best = {n: max(results[n], key=lambda o: o["tokens_per_s"]) for n in names}
    for n in names:
        print(f"{n:16}" + "".join(f"{o['tokens_per_s']:10.0f}" for o in results[n])
              + f"{best[n]['tokens_per_s']:10.0f}", file=sys.stderr)
    for n in skipped:
        print(f"{n:16}  (not available in this PyTorch)", file=sys.stderr)
    fastest = max(names, key=lambda n: best[n]["tokens_per_s"])
    print(f"fastest: {fastest}", file=sys.stderr)
    out = dict(best[fastest])
    out["formulations"] = {n: [o["tokens_per_s"] for o in results[n]] for n in names}
    print(json.dumps(out), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="with --formulation all: interleaved rounds")
    args = ap.parse_args()
    if args.formulation == "all":
        return compare_formulations(args)
    set_thread_env(args.threads)
    import torch
    import torch_gpt_formulations as forms
    torch.set_num_threads(args.threads)
    cfg = gpt_config(args)
    formulation = args.formulation or forms.fastest(args.precision)
    data = read_llmc_tokens(args.data, cfg.vocab_size) if args.data else None
    total = args.max_warmup_steps + args.steps
    batches = Batches(cfg, args.micro_batch, args.grad_accum, 1, total, data, args.seed)
    torch.manual_seed(args.seed)
    model = forms.build(formulation, cfg)
    opt = make_optimizer(torch, model, args)

    autocast = autocast_scope(torch, args.precision)

    def one_step(step):
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for k in range(args.grad_accum):
            x, y = batches.micro(step, k, 0)
            with autocast():
                _, loss = model(x, y)
            (loss / args.grad_accum).backward()
            tot += loss.item() / args.grad_accum
        opt.step()
        return tot

    losses, timed, warm, faults = run_steps(args, one_step)
    stats = step_stats(timed)
    tokens = args.micro_batch * args.grad_accum * cfg.block_size
    tps = tokens / (stats["step_ms"] / 1e3)
    fpt = flops_per_token(model)
    out = {"impl": "pytorch", "model": args.preset, "formulation": formulation,
           "precision": args.precision,
           "config": cfg.to_dict(), "tokens_per_s": round(tps, 2), **stats,
           "tokens_per_s_min": round(tokens / (stats["step_ms_max"] / 1e3), 2),
           "tokens_per_s_max": round(tokens / (stats["step_ms_min"] / 1e3), 2),
           "peak_rss_bytes": peak_rss_bytes(), "threads": args.threads,
           "flops_per_token": fpt, "gflops": round(fpt * tps / 1e9, 3),
           "micro_batch": args.micro_batch, "grad_accum": args.grad_accum,
           "steps": args.steps, "warmup_steps_run": warm, "page_faults_per_step": faults,
           "params": sum(p.numel() for p in model.parameters()),
           "loss_first": round(losses[0], 5),
           "loss_last": round(losses[-1], 5), "data": args.data or "random",
           "torch": torch.__version__, "env": env_report()}
    print(json.dumps(out), flush=True)
    if not all(math.isfinite(v) for v in losses):
        print("error: non-finite loss", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
