"""A user's `torchrun` script: plain torch.distributed + DDP on a small model, gloo on CPU.

    torchrun ... torchrun_train.py --out DIR [--steps N]

Every process writes DIR/rank-<R>.json with the wiring torchrun gave it, the
all_reduce of rank+1 and a checksum of the trained weights (equal on every rank).
"""

import argparse
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1 + rank)  # every rank its own data shard
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(0))
    for _ in range(a.steps):
        x = torch.randn(8, 16, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x @ w)
        loss.backward()
        opt.step()
        opt.zero_grad()

    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    record = {
        k.lower(): os.environ.get(k)
        for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    record.update(
        rank=rank,
        world_size=world,
        hostname=socket.gethostname(),
        slurmd_nodename=os.environ.get("SLURMD_NODENAME"),
        allreduce=t.item(),
        weights_checksum=sum(p.detach().double().sum().item() for p in model.parameters()),
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(record, indent=1))
    print(f"[torchrun_train] rank {rank}/{world} all_reduce {t.item():g}", flush=True)
    dist.barrier()  # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()
    # torch 2.13 with gloo: a worker thread that lets go of the last finished collective once interpreter finalization
    # has begun cannot take the GIL and aborts the process (exit 134, now and then on a busy machine); this script's
    # work is written, so it leaves without the teardown (hpc.integrations wait for those threads at exit instead)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
