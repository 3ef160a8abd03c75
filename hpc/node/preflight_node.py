"""Node side of the preflight, run on every rank under hpc.node.launch:

    python -m hpc.node.preflight_node --out DIR --gpus G [--matmul-tflops T] [--copy-gbps B]
        [--min-bytes B] [--max-bytes B] [--iters N]

Gathers each node's facts (interfaces, HCA ports, GPUs, NCCL/gloo settings, hpc.node.health's findings), then
sweeps all_reduce bus bandwidth (nccl on GPUs, gloo on CPU) over all ranks, over
each node's ranks, and over every pair of nodes, one pair at a time. Rank 0 writes
DIR/node-<job id>.json; `python -m hpc.preflight` submits this and reads it.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from hpc.node.bandwidth import MAX_BYTES, MAX_ITERS, human_bytes, size_ladder, sweep
from hpc.node.cli import Parser, number, path_text, whole
from hpc.node.contract import LOCAL_RANK_VAR, NETWORK_VAR_PREFIXES, PREFLIGHT_RESULT
from hpc.node.health import DEFAULT_MIN_FRACTION, node_findings
from hpc.node.launcher import local_cuda_index
from hpc.node.netcheck import bound_every_group, check_node, dist_timeout_s, hca_ports, interfaces
from hpc.node.slurm_env import node_name

DEFAULT_SIZES = {"cuda": (8 << 10, 1 << 30), "cpu": (4 << 10, 16 << 20)}
DEFAULT_ITERS = {"cuda": (20, 5), "cpu": (5, 2)}


def node_facts(a) -> dict:
    """What this node has: interfaces, HCA ports, GPUs, the network settings in force, and its GPU health findings."""
    gpus = (
        [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 1e9, 1),
            }
            for i in range(torch.cuda.device_count())
        ]
        if torch.cuda.is_available()
        else []
    )
    return {
        "hostname": socket.gethostname(),
        "interfaces": [asdict(i) for i in interfaces()],
        "hca_ports": [asdict(p) for p in hca_ports()],
        "cuda_gpus": gpus,
        "slurm_gpus": os.environ.get("SLURM_STEP_GPUS")
        or os.environ.get("SLURM_JOB_GPUS")
        or os.environ.get("CUDA_VISIBLE_DEVICES"),
        "network_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(NETWORK_VAR_PREFIXES)},
        "selected": check_node(os.environ),
        "health": [asdict(f) for f in node_findings(a.gpus, a.matmul_tflops, a.copy_gbps, a.health_fraction)],
    }


def say(msg: str) -> None:
    if dist.get_rank() == 0:
        print(f"[preflight] {msg}", flush=True)


def row_text(row: dict) -> str:
    return f"{human_bytes(row['bytes']):>7}  {row['time_us']:10.1f} us  busbw {row['busbw_gbps']:8.3f} GB/s"


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = Parser(prog="python -m hpc.node.preflight_node", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=path_text, help="directory for node-<job id>.json (written by rank 0)")
    p.add_argument("--min-bytes", type=whole(1, MAX_BYTES), help="smallest message (default: 8 KB on GPU, 4 KB on CPU)")
    p.add_argument("--max-bytes", type=whole(1, MAX_BYTES), help="largest message (default: 1 GB on GPU, 16 MB on CPU)")
    p.add_argument(
        "--iters", type=whole(1, MAX_ITERS), help="timed all_reduces per size (default: 20 on GPU, 5 on CPU)"
    )
    p.add_argument("--pair-sizes", type=whole(1, 64), default=3, help="node pairs run the largest N sizes")
    p.add_argument(
        "--gpus", type=whole(0, 1024), required=True, help="GPUs per node the job asked for (hpc.node.health)"
    )
    p.add_argument("--matmul-tflops", type=number(0, 1e6, lo_open=True), help="expected bf16 matmul TFLOP/s per GPU")
    p.add_argument("--copy-gbps", type=number(0, 1e6, lo_open=True), help="expected device copy GB/s per GPU")
    p.add_argument(
        "--health-fraction",
        type=number(0, 1, lo_open=True),
        default=DEFAULT_MIN_FRACTION,
        help="a GPU below this fraction of an expected rate fails",
    )
    a = p.parse_args(argv)

    kind = "cuda" if torch.cuda.is_available() else "cpu"
    local_rank = int(os.environ.get(LOCAL_RANK_VAR, "0"))
    device = (
        torch.device(kind, local_cuda_index(local_rank, torch.cuda.device_count()))
        if kind == "cuda"
        else torch.device("cpu")
    )
    if kind == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if kind == "cuda" else "gloo"
    timeout = dist_timeout_s(os.environ)
    dist.init_process_group(backend, timeout=bound_every_group(timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    lo, hi = a.min_bytes or DEFAULT_SIZES[kind][0], a.max_bytes or DEFAULT_SIZES[kind][1]
    sizes = size_ladder(lo, hi)
    iters, warmup = (a.iters, 2) if a.iters else DEFAULT_ITERS[kind]

    me = {
        "rank": rank,
        "node_rank": int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))),
        "node": node_name(),
        "facts": node_facts(a) if local_rank == 0 else None,
    }
    everyone: list = [None] * world
    dist.all_gather_object(everyone, me)
    nodes: dict[int, dict] = {}
    for r in sorted(everyone, key=lambda r: r["rank"]):
        n = nodes.setdefault(
            r["node_rank"], {"node_rank": r["node_rank"], "name": r["node"], "ranks": [], "facts": None}
        )
        n["ranks"].append(r["rank"])
        n["facts"] = n["facts"] or r["facts"]
    order = [nodes[k] for k in sorted(nodes)]
    mine = next(n for n in order if rank in n["ranks"])
    say(
        f"{world} ranks on {len(order)} node(s), {backend} on {kind}, {len(sizes)} sizes "
        f"{human_bytes(sizes[0])}..{human_bytes(sizes[-1])}, {iters} iterations each, timeout {timeout:g} s"
    )

    say(f"all {world} ranks")
    result = {"all": sweep(sizes, device, None, iters, warmup, progress=lambda r: say(row_text(r)))}

    node_groups = {n["name"]: dist.new_group(n["ranks"]) for n in order}
    intra = None
    if len(mine["ranks"]) > 1:
        say(f"each node's {len(mine['ranks'])} ranks, all nodes at once")
        intra = sweep(
            sizes,
            device,
            node_groups[mine["name"]],
            iters,
            warmup,
            progress=lambda r: say(f"{mine['name']}: " + row_text(r)),
        )
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (mine["name"], intra) if rank == mine["ranks"][0] else None)
    result["intra"] = {name: rows for name, rows in filter(None, gathered) if rows is not None}

    result["pairs"] = []
    pair_sizes = sizes[-a.pair_sizes :]
    for x, y in itertools.combinations(order, 2):
        ranks = x["ranks"] + y["ranks"]
        group = dist.new_group(ranks)
        rows = [sweep(pair_sizes, device, group, iters, warmup) if rank in ranks else None]
        dist.broadcast_object_list(rows, src=ranks[0])
        result["pairs"].append({"nodes": [x["name"], y["name"]], "ranks": len(ranks), "rows": rows[0]})
        say(f"pair {x['name']}-{y['name']}: " + row_text(rows[0][-1]))

    if rank == 0:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        job = os.environ.get("SLURM_JOB_ID", "local")
        record = {
            "job_id": job,
            "world_size": world,
            "backend": backend,
            "device": kind,
            "iters": iters,
            "warmup": warmup,
            "timeout_s": timeout,
            "sizes": sizes,
            "nodes": order,
            **result,
        }
        path = out / PREFLIGHT_RESULT.format(job_id=job)
        path.write_text(json.dumps(record, indent=1))
        say(f"wrote {path}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
