"""NCCL all_reduce bus-bandwidth sweep on the GPUs of one machine (the preflight's sweep code).

    python bench/allreduce_sweep.py [--min-bytes 8192] [--max-bytes 1073741824] [--iters 20] [--out FILE]

One process per visible GPU, NCCL over a local TCP rendezvous; prints JSON (and writes
it to --out): the all_reduce sweep over all GPUs, and GPU 0's device-local copy rate per
size, the ceiling a single GPU sets. With one GPU an all_reduce crosses no link: busbw is
0 by definition and the time is the collective's fixed cost.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hpc.node.bandwidth import copy_bandwidth, human_bytes, size_ladder, sweep
from hpc.node.cli import Parser, whole


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, port: int, a: argparse.Namespace, result: dict) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
        device_id=device,
    )
    sizes = size_ladder(a.min_bytes, a.max_bytes, a.factor)

    def progress(row: dict) -> None:
        if rank == 0:
            print(
                f"[bench] all_reduce x{world} {human_bytes(row['bytes']):>7}: {row['time_us']:9.1f} us  "
                f"algbw {row['algbw_gbps']:8.1f}  busbw {row['busbw_gbps']:8.1f} GB/s",
                file=sys.stderr,
                flush=True,
            )

    rows = sweep(sizes, device, None, a.iters, a.warmup, progress=progress)
    if rank == 0:
        copy = copy_bandwidth(sizes, device, a.iters, a.warmup)
        for row in copy:
            print(
                f"[bench] copy {human_bytes(row['bytes']):>7}: {row['copy_gbps']:8.1f} GB/s",
                file=sys.stderr,
                flush=True,
            )
        result.update(all_reduce=rows, copy=copy)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", type=whole(1), default=8 << 10)
    p.add_argument("--max-bytes", type=whole(1), default=1 << 30)
    p.add_argument("--factor", type=whole(2), default=2, help="size step")
    p.add_argument("--iters", type=whole(1), default=20)
    p.add_argument("--warmup", type=whole(0), default=5)
    p.add_argument("--out", help="also write the JSON here")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/allreduce_sweep.py: error: no CUDA device visible")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    world = torch.cuda.device_count()
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(worker, args=(world, free_port(), a, result), nprocs=world)
        record = {
            "gpus": [torch.cuda.get_device_name(i) for i in range(world)],
            "world_size": world,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "iters": a.iters,
            "warmup": a.warmup,
            "bus_factor": 2 * (world - 1) / world,
            **dict(result),
        }
    text = json.dumps(record, indent=1)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
