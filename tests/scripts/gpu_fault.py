"""A user's script whose rank 1 raises the exception PyTorch raises for an unspecified launch failure
(``torch.AcceleratorError``, CUDA error 719) in every start of its ranks, under `hpc.node.fault_exit.reported_faults`;
the other ranks wait to be ended (tests/slurm/test_node_faults.py)."""

import os
import time

import torch

from hpc.node.fault_exit import reported_faults

with reported_faults():
    rank = os.environ["RANK"]
    print(f"[script] rank {rank} on {os.environ.get('SLURMD_NODENAME')} up", flush=True)
    if rank == "1":
        time.sleep(1)
        error = torch.AcceleratorError("CUDA error: unspecified launch failure")
        error.error_code = 719  # as torch sets it on the exceptions it raises
        raise error
    time.sleep(300)
