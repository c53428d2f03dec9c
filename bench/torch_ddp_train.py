#!/usr/bin/python3
"""PyTorch DDP baseline for paratrain's data-parallel benchmark: GPT (gpt-mini), gloo, f32.

The model (the fastest formulation measured, bench/torch_gpt_formulations.py, or
--formulation), optimizer, data, warm-up to steady state and figures are those of
bench/torch_gpt_train.py, under
torch.nn.parallel.DistributedDataParallel (gloo backend, default 25 MiB buckets, gradients
averaged). Each rank runs --micro-batch sequences per micro-step with --threads threads
(default 1); the global batch is micro_batch * grad_accum * world_size windows, cut as
DESIGN.md says (slice j = k*world + r to rank r, micro-step k), with no_sync() on the first
grad_accum-1 micro-steps.

Two ways to start it:
  /usr/bin/python3 bench/torch_ddp_train.py --nproc 2          spawns 2 ranks itself
      (torch.multiprocessing, MASTER_ADDR 127.0.0.1 and a free port);
  RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment    (an outside launcher:
      torchrun, paratrain launch, mpirun with those set) -- one rank per process.

Rank 0 prints one JSON line with the fields of torch_gpt_train.py plus world_size:
  tokens_per_s      whole global batch (all ranks) per second of the median timed step;
  step_ms           median timed step of rank 0 (step_ms_min/max/mean/all: the spread);
                    ranks agree on when warm-up ends (the largest page-fault count wins);
  peak_rss_bytes    the largest ru_maxrss * 1024 over the ranks;
  peak_rss_bytes_per_rank, step_ms_per_rank   one entry per rank.
--nproc 1 gives the 1 x 1 baseline for scaling efficiency under the same code path.

Run tuned: bench/torch_env.sh /usr/bin/python3 bench/torch_ddp_train.py --nproc 2
"""
import argparse
import json
import math
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import torch_gpt_train as common  # noqa: E402  (does not import torch at module level)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import torch_gpt_formulations as forms

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = common.gpt_config(args)
    data = common.read_llmc_tokens(args.data, cfg.vocab_size) if args.data else None
    total = args.max_warmup_steps + args.steps
    formulation = args.formulation or forms.fastest(args.precision)
    batches = common.Batches(cfg, args.micro_batch, args.grad_accum, world, total, data,
                             args.seed)
    torch.manual_seed(args.seed)
    model = forms.build(formulation, cfg)
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = common.make_optimizer(torch, model, args)

    autocast = common.autocast_scope(torch, args.precision)

    def one_step(step):
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for k in range(args.grad_accum):
            x, y = batches.micro(step, k, rank)
            if k < args.grad_accum - 1:
                with ddp.no_sync():
                    with autocast():
                        _, loss = ddp(x, y)
                    (loss / args.grad_accum).backward()
            else:
                with autocast():
                    _, loss = ddp(x, y)
                (loss / args.grad_accum).backward()
            tot += loss.item() / args.grad_accum
        opt.step()
        return tot

    def faults_everywhere():  # the largest page-fault count of any rank: all ranks agree
        t = torch.tensor([float(common.minor_faults())], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    losses, timed, warm, faults = common.run_steps(args, one_step, faults=faults_everywhere)
    stats = common.step_stats(timed)
    step_s = stats["step_ms"] / 1e3
    dist.barrier()

    mine = torch.tensor([float(common.peak_rss_bytes()), stats["step_ms"],
                         losses[0], losses[-1]], dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        rss = [int(g[0].item()) for g in gathered]
        tokens = args.micro_batch * args.grad_accum * world * cfg.block_size
        tps = tokens / step_s
        fpt = common.flops_per_token(model)
        out = {"impl": "pytorch-ddp", "model": args.preset, "config": cfg.to_dict(),
               "world_size": world, "backend": "gloo",
               "formulation": formulation, "precision": args.precision, "tokens_per_s": round(tps, 2), **stats,
               "tokens_per_s_min": round(tokens / (stats["step_ms_max"] / 1e3), 2),
               "tokens_per_s_max": round(tokens / (stats["step_ms_min"] / 1e3), 2),
               "peak_rss_bytes": max(rss), "peak_rss_bytes_per_rank": rss,
               "step_ms_per_rank": [round(g[1].item(), 3) for g in gathered],
               "threads": args.threads, "flops_per_token": fpt,
               "gflops": round(fpt * tps / 1e9, 3), "micro_batch": args.micro_batch,
               "grad_accum": args.grad_accum, "global_batch": args.micro_batch *
               args.grad_accum * world, "steps": args.steps,
               "warmup_steps_run": warm, "page_faults_per_step": faults,
               "params": sum(p.numel() for p in model.parameters()),
               "loss_first": round(sum(g[2].item() for g in gathered) / world, 5),
               "loss_last": round(sum(g[3].item() for g in gathered) / world, 5),
               "data": args.data or "random", "torch": torch.__version__,
               "env": common.env_report()}
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()
    if not all(math.isfinite(v) for v in losses):
        raise SystemExit(f"rank {rank}: non-finite loss")


def spawned(rank, world, args):
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    worker(rank, world, args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_common_args(ap)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks to spawn (ignored when RANK/WORLD_SIZE are set)")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    args = ap.parse_args()
    common.set_thread_env(args.threads)  # before torch is imported, inherited by children

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            raise SystemExit("error: RANK/WORLD_SIZE set but MASTER_PORT is not")
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(args.nproc, args), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
