# A PyTorch program as a user writes it for torchrun, for tests/launch/launch_torchrun_test.cpp:
# the default env:// rendezvous (rank 0 hosts a TCPStore on MASTER_ADDR:MASTER_PORT), gloo,
# one all_reduce of [rank + 1, (rank + 1)^2]. Run with /usr/bin/python3 (Debian's python3-torch).
#
# Prints, each line flushed: the torchrun variables as KEY=VALUE (KEY=<unset> when absent),
# TORCH_THREADS=<torch.get_num_threads()>, then
#   TORCH_OK rank=<r> world=<w> sum=<s1>,<s2> restart=<TORCHELASTIC_RESTART_COUNT>
# Options:
#   --fail-rank R --code C   rank R exits with C after the all-reduce, while every other rank
#                            sleeps (so the launcher has to stop it)
#   --first-attempt-only     ... only while TORCHELASTIC_RESTART_COUNT is 0
# Otherwise every rank passes a barrier, destroys its group and exits 0.
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

VARS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "PARATRAIN_STORE_PORT"]


def option(args, name, default):
    return int(args[args.index(name) + 1]) if name in args else default


def main():
    args = sys.argv[1:]
    fail_rank = option(args, "--fail-rank", -1)
    code = option(args, "--code", 1)
    first_only = "--first-attempt-only" in args
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    lines = [f"{k}={os.environ.get(k, '<unset>')}" for k in VARS]
    lines.append(f"TORCH_THREADS={torch.get_num_threads()}")
    print("\n".join(lines), flush=True)

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # env://, as under torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1), float((rank + 1) ** 2)])
    dist.all_reduce(t)
    print(f"TORCH_OK rank={rank} world={world} sum={int(t[0].item())},{int(t[1].item())} restart={restart}",
          flush=True)

    if fail_rank >= 0 and (not first_only or restart == 0):
        if rank == fail_rank:
            print(f"rank {rank} failing on purpose with exit code {code}", file=sys.stderr, flush=True)
            os._exit(code)
        time.sleep(120)  # the launcher stops this rank when rank fail_rank fails
        os._exit(0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
