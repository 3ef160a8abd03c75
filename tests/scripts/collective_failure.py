"""Two ranks under torchrun (gloo): after one all_reduce rank 1 ends its process (``ended``) or stops it (``stopped``,
SIGSTOP); rank 0's next all_reduce fails and rank 0 prints what hpc.node.hang.collective_failure calls the error.
Rank 1 ends with exit 0: torchrun ends the other ranks when one fails, which could take rank 0 before it prints, but
waits for them when one succeeds.

    torchrun --nproc-per-node=2 collective_failure.py {ended,stopped} TIMEOUT_S
"""

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from hpc.node.hang import collective_failure

mode, timeout_s = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    if mode == "ended":
        os._exit(0)
    os.kill(os.getpid(), signal.SIGSTOP)
try:
    dist.all_reduce(t)
except RuntimeError as e:
    print(f"[collective_failure] {collective_failure(e)}: {e}", flush=True)
os._exit(0)  # the peer is gone or stopped: no teardown
