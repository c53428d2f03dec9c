#!/usr/bin/python3
"""Gloo's all-reduce (torch.distributed, Debian python3-torch): 2 ranks on this host.
Usage: comm_gloo_allreduce.py MIN_BYTES MAX_BYTES ITERS. Prints: bytes time_us busbw_gbps."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, lo, hi, iters, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    size = lo
    while size <= hi:
        x = torch.ones(size // 4, dtype=torch.float32)
        it = iters * 50 if size <= (1 << 20) else iters
        for _ in range(3):
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(it):
            dist.all_reduce(x)
        t = torch.tensor([(time.perf_counter() - t0) / it], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            s = t.item()
            print(f"{size} {s * 1e6:.2f} {size / s / 1e9 * 2 * (world - 1) / world:.3f}", flush=True)
        size *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    lo, hi, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    port = 29500 + os.getpid() % 20000
    mp.spawn(run, args=(2, lo, hi, iters, port), nprocs=2, join=True)
