"""Two ranks under torchrun (gloo) start a checkpoint save (train.checkpoint.start_save); rank 1's process ends
once the save's checks agreed, as when its node is lost in the middle of the write, and rank 0 prints what its save
raised: the collective's own error, which hpc.node.hang.collective_failure names, or the save's CheckpointError.
Rank 1 ends with exit 0: torchrun ends the other ranks when one fails, which could take rank 0 before it prints.

    torchrun --nproc-per-node=2 save_peer_lost.py DIR TIMEOUT_S
"""

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hpc.node.hang import collective_failure
from train import checkpoint

root, timeout_s = Path(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.ones(2, 4)).sum().backward()
optimizer.step()
if dist.get_rank() == 1:
    checkpoint.dcp.save = lambda *args, **kwargs: os._exit(0)  # this rank's process ends where the write begins
try:
    checkpoint.start_save(root, 5, model, optimizer, {}, keep_last=2, run_id="r")
    print("[save_peer_lost] saved", flush=True)
except checkpoint.CheckpointError as e:
    print(f"[save_peer_lost] CheckpointError: {e}", flush=True)
except (RuntimeError, dist.DistError) as e:
    print(f"[save_peer_lost] {collective_failure(e)}: {type(e).__name__}: {e}", flush=True)
os._exit(0)  # the peer is gone: no teardown
