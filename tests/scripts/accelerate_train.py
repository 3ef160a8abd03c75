"""A user's `accelerate launch` script: an Accelerator() loop fitting a small model on CPU or GPU.

    accelerate launch ... accelerate_train.py --out DIR [--steps N]

Every process writes DIR/rank-<R>.json (world size, rank, node, the summed
reduce of rank+1 and a checksum of the trained weights, which DDP keeps equal
on every rank); under hpc.submit the main process appends one metrics line per
step to $HPC_JOB_DIR/metrics.jsonl, where the trainer writes its metrics too.
"""

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    acc = Accelerator()
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = x @ torch.randn(16, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)

    metrics = None
    if acc.is_main_process and os.environ.get("HPC_JOB_DIR"):
        metrics = Path(os.environ["HPC_JOB_DIR"]) / "metrics.jsonl"
    batches = iter(loader)
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        xb, yb = next(batches)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        grad_norm = acc.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        opt.zero_grad()
        loss = acc.reduce(loss.detach(), "mean").item()
        if metrics:
            rec = {
                "step": step,
                "loss": loss,
                "grad_norm": float(grad_norm),
                "lr": 0.05,
                "tokens_per_s": acc.num_processes * len(xb) / (time.perf_counter() - t0),
                "mfu": None,
            }
            with metrics.open("a") as f:
                f.write(json.dumps(rec) + "\n")

    reduced = acc.reduce(torch.tensor([acc.process_index + 1.0], device=acc.device), "sum").item()
    ranks = acc.gather(torch.tensor([acc.process_index], device=acc.device)).tolist()
    checksum = sum(p.detach().double().sum().item() for p in acc.unwrap_model(model).parameters())
    record = {
        "rank": acc.process_index,
        "local_rank": acc.local_process_index,
        "world_size": acc.num_processes,
        "node_rank": int(os.environ.get("GROUP_RANK", -1)),
        "hostname": socket.gethostname(),
        "slurmd_nodename": os.environ.get("SLURMD_NODENAME"),
        "distributed_type": str(acc.distributed_type),
        "allreduce": reduced,
        "gathered": ranks,
        "weights_checksum": checksum,
        "loss": loss,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{acc.process_index}.json").write_text(json.dumps(record, indent=1))
    acc.print(
        f"[accelerate_train] {acc.num_processes} processes, {acc.distributed_type}, reduce {reduced:g}, loss {loss:.4f}"
    )
    acc.wait_for_everyone()  # no process tears its connections down while a peer still uses them
    acc.end_training()
    # torch 2.13 with gloo: a worker thread that lets go of the last finished collective once interpreter finalization
    # has begun cannot take the GIL and aborts the process (exit 134, now and then on a busy machine); this script's
    # work is written, so it leaves without the teardown (hpc.integrations wait for those threads at exit instead)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
