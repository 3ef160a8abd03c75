"""A user's accelerate loop with hpc.integrations.accelerate.Requeue: a small model with dropout (so the RNG state
matters), AdamW, a schedule and a shuffled loader over several epochs.

    accelerate launch ... accelerate_requeue.py --out DIR [--steps N] [--notice-at STEP --notice-to self|parent]
                                                [--hang-rank R --hang-at STEP] [--step-time S]

The main process appends {"step", "loss"} per step to OUT/losses.jsonl; ``--notice-at``: after that step rank 0
sends the pre-stop signal to itself or to its parent (hpc.node.launch), as Slurm would; ``--hang-rank``: after
``--hang-at`` that rank stops itself (SIGSTOP), as a hung process or a node gone would, so the others time out;
``--step-time``: each step lasts at least S seconds, so that a signal sent from outside after one step lands a few
steps later, not after the last.
"""

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

from hpc.integrations.accelerate import Requeue
from hpc.node.contract import prestop_signal


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--notice-at", type=int)
    p.add_argument("--notice-to", choices=("self", "parent"), default="self")
    p.add_argument("--hang-rank", type=int)
    p.add_argument("--hang-at", type=int)
    p.add_argument("--step-time", type=float, default=0.0)
    a = p.parse_args()
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    requeue = Requeue(accelerator, Path(a.out) / "checkpoints")
    torch.manual_seed(0)
    x = torch.randn(96, 16)
    y = x @ torch.randn(16, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.2), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + 0.1 * s))
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    Path(a.out).mkdir(parents=True, exist_ok=True)
    losses = Path(a.out) / "losses.jsonl"
    step = requeue.load()
    for xb, yb in requeue.batches(loader):
        began = time.monotonic()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        loss = accelerator.reduce(loss.detach(), "mean").item()
        if accelerator.is_main_process:
            with losses.open("a") as f:
                f.write(json.dumps({"step": step, "loss": loss}) + "\n")
        time.sleep(max(0.0, a.step_time - (time.monotonic() - began)))
        if step % 4 == 0:
            requeue.save(step)
        if step == a.steps:
            break
        if step == a.notice_at and accelerator.is_main_process:
            os.kill(os.getpid() if a.notice_to == "self" else os.getppid(), prestop_signal(os.environ))
        if step == a.hang_at and accelerator.process_index == a.hang_rank:
            os.kill(os.getpid(), signal.SIGSTOP)
        requeue.stop_if_noticed(step)
    accelerator.end_training()


if __name__ == "__main__":
    main()
