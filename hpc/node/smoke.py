"""A distributed smoke job: every rank records its wiring and joins a gloo all_reduce.

``python -m hpc.node.smoke --out DIR``: each rank writes DIR/rank-<RANK>.json; the all_reduce of (rank + 1) must
equal world_size * (world_size + 1) / 2 on every rank, else the job fails."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from hpc.node.cli import Parser, fail, number, path_text
from hpc.node.contract import (
    DEFAULT_DIST_TIMEOUT_S,
    DIST_TIMEOUT_VAR,
    EXIT_FAILED,
    LOCAL_RANK_VAR,
    LOCAL_WORLD_SIZE_VAR,
    MASTER_ADDR_VAR,
    MASTER_PORT_VAR,
    NODE_RANK_VAR,
    RANK_VAR,
    WORLD_SIZE_VAR,
)
from hpc.node.netcheck import bound_every_group, dist_timeout_s

PROG = "hpc.node.smoke"
FIELDS = (
    RANK_VAR,
    WORLD_SIZE_VAR,
    LOCAL_RANK_VAR,
    LOCAL_WORLD_SIZE_VAR,
    NODE_RANK_VAR,
    MASTER_ADDR_VAR,
    MASTER_PORT_VAR,
)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = Parser(prog=f"python -m {PROG}")
    p.add_argument("--out", required=True, type=path_text, help="directory for one JSON record per rank")
    p.add_argument(
        "--timeout",
        type=number(0, 10**7, lo_open=True),
        default=dist_timeout_s(os.environ),
        help=f"seconds for rendezvous and the collective (default: ${DIST_TIMEOUT_VAR}, else {DEFAULT_DIST_TIMEOUT_S})",
    )
    a = p.parse_args(argv)
    dist.init_process_group("gloo", timeout=bound_every_group(a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    record = {k.lower(): os.environ.get(k) for k in FIELDS}
    record["node_rank"] = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK"))  # torchrun sets GROUP_RANK
    record.update(
        hostname=socket.gethostname(),
        slurmd_nodename=os.environ.get("SLURMD_NODENAME"),
        job_id=os.environ.get("SLURM_JOB_ID"),
        allreduce=t.item(),
        expected=expected,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),  # the GPUs Slurm gave this task
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(record, indent=1))
    print(f"[smoke] rank {rank}/{world} all_reduce {t.item():g} (expected {expected:g})", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if t.item() != expected:
        fail(PROG, f"all_reduce gave {t.item()}, expected {expected}", EXIT_FAILED)


if __name__ == "__main__":
    main()
