"""SLURM_* environment -> the rank wiring torch.distributed expects: one table of Slurm's variables,
read for a launcher (`hpc.node.launcher`: a task per GPU, or a task per node that starts the node's ranks)."""

from __future__ import annotations

import os
import re
import socket
from typing import Mapping, Optional

import hostlist

from hpc.node.cli import HpcError, shown
from hpc.node.contract import (
    ATTEMPT_VAR,
)
from hpc.node.launcher import LAUNCHERS, SRUN, Launcher
from hpc.node.rank_info import RankInfo

# property -> Slurm variables, first one present wins (step values before job values)
SLURM_VARS: dict[str, tuple[str, ...]] = {
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "global_rank": ("SLURM_PROCID",),
    "num_tasks": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
    "local_rank": ("SLURM_LOCALID",),
    "node_rank": ("SLURM_NODEID",),
    "num_nodes": ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    "gpus_on_node": ("SLURM_GPUS_ON_NODE",),
    "restart_count": ("SLURM_RESTART_COUNT",),
}

# Ports for the rendezvous: below Linux's default ephemeral range (32768-60999),
# so a port the kernel handed to some client socket never collides with it.
PORT_BASE = 15000
PORT_SPAN = 17000


def node_name(environ: Mapping[str, str] = os.environ) -> str:
    """This node's name as Slurm knows it (the host name outside Slurm)."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


class RankError(HpcError):
    """The environment cannot give a consistent rank layout; the message says what to change."""


def slurm_values(environ: Mapping[str, str]) -> dict[str, Optional[str]]:
    """Each property of `SLURM_VARS` read from the environment (None when absent)."""
    return {prop: next((environ[n] for n in names if environ.get(n)), None) for prop, names in SLURM_VARS.items()}


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed counts, e.g. '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(
            r"([0-9]{1,6})(?:\(x([1-9][0-9]{0,5})\))?", part.strip()
        )  # bounded: a node count, not a memory bomb
        if not m:
            raise RankError(f"SLURM_TASKS_PER_NODE={shown(text)} is not in Slurm's form, e.g. '2(x3),1'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def master_port(job_id: int, restart_count: int = 0, attempt: int = 0) -> int:
    """Deterministic per job (and restart, and in-job attempt), identical on all ranks, outside the ephemeral range."""
    return PORT_BASE + (job_id + 1009 * restart_count + 31 * attempt) % PORT_SPAN


def node_hosts(nodelist: str) -> list[str]:
    """The hosts of a compressed hostlist, e.g. 'gpu-a[001-003],gpu-b7' -> ['gpu-a001', 'gpu-a002', 'gpu-a003',
    'gpu-b7']."""
    try:
        hosts = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as e:
        raise RankError(f"SLURM_JOB_NODELIST={shown(nodelist)} is not a valid hostlist ({e})") from None
    if not hosts:
        raise RankError("SLURM_JOB_NODELIST is empty")
    return hosts


def derive(environ: Mapping[str, str], launcher: Launcher = SRUN, gpus_per_node: Optional[int] = None) -> RankInfo:
    """Rank wiring from a Slurm task's environment.

    `gpus_per_node` is how many ranks each node should run (defaults to
    SLURM_GPUS_ON_NODE); under srun it must equal the tasks on the node.
    """
    v = slurm_values(environ)
    missing = [SLURM_VARS[p][0] for p in launcher.needs if v[p] is None]
    if missing:
        raise RankError(
            f"missing {', '.join(missing)}: run this inside a Slurm job step (sbatch + srun), "
            "not on the login node or in the batch shell alone"
        )

    def number(prop: str) -> Optional[int]:
        text = v[prop]
        if text is None:
            return None
        if not re.fullmatch(
            r"[0-9]{1,10}", text
        ):  # int() would read "12_3" as 123, and other scripts' digits; 10: 32 bits
            raise RankError(
                f"{next(n for n in SLURM_VARS[prop] if environ.get(n))}={shown(text)} is not a whole number"
            )
        return int(text)

    job_id, num_tasks, node_rank, num_nodes = (number(k) for k in ("job_id", "num_tasks", "node_rank", "num_nodes"))
    restart = number("restart_count") or 0
    attempt_text = environ.get(ATTEMPT_VAR, "0")
    if not re.fullmatch(r"[0-9]{1,6}", attempt_text):
        raise RankError(f"{ATTEMPT_VAR}={shown(attempt_text)} is not a whole number")
    gpus = gpus_per_node if gpus_per_node is not None else number("gpus_on_node")
    if gpus is not None and gpus < 1:
        raise RankError(f"--gpus-per-node {gpus}: must be at least 1")
    if num_nodes < 1 or num_tasks < 1:
        raise RankError(f"{num_tasks} tasks on {num_nodes} nodes: both must be at least 1")
    if node_rank >= num_nodes:
        raise RankError(f"SLURM_NODEID={node_rank} but the step has {num_nodes} nodes (allowed 0 to {num_nodes - 1})")
    hosts = node_hosts(v["nodelist"])
    if len(hosts) != num_nodes:
        raise RankError(
            f"SLURM_JOB_NODELIST={shown(v['nodelist'])} has {len(hosts)} host(s) but the step has {num_nodes} nodes"
        )
    addr, port = hosts[0], master_port(job_id, restart, int(attempt_text))

    if launcher.per_node:
        if num_tasks != num_nodes:
            raise RankError(
                f"launcher {launcher.name} needs one task per node, got {num_tasks} tasks on {num_nodes} nodes: "
                f"use --ntasks-per-node=1 ({launcher.name} starts the node's ranks itself)"
            )
        if not gpus:
            raise RankError(
                f"launcher {launcher.name} needs the ranks per node: request --gpus-per-node or pass --gpus-per-node "
                "to hpc.node.launch"
            )
        return RankInfo(job_id, node_rank * gpus, num_nodes * gpus, 0, gpus, node_rank, num_nodes, addr, port, restart)

    per_node = expand_tasks_per_node(v["tasks_per_node"])
    if len(per_node) != num_nodes:
        raise RankError(
            f"SLURM_TASKS_PER_NODE={shown(v['tasks_per_node'])} lists {len(per_node)} node(s) but the step has "
            f"{num_nodes}"
        )
    if len(set(per_node)) != 1:
        raise RankError(
            f"tasks per node differ across nodes ({v['tasks_per_node']}): request --ntasks-per-node "
            "so every node runs the same number of ranks"
        )
    local_world = per_node[0]
    if gpus and local_world != gpus:
        raise RankError(
            f"{local_world} tasks per node but {gpus} GPUs per node: use --ntasks-per-node={gpus} "
            f"(one task per GPU) or a launcher with one task per node "
            f"({', '.join(n for n, launcher in LAUNCHERS.items() if launcher.per_node)})"
        )
    if local_world * num_nodes != num_tasks:
        raise RankError(f"{num_tasks} tasks do not fill {num_nodes} nodes x {local_world} tasks per node")
    rank, local_rank = number("global_rank"), number("local_rank")
    if rank >= num_tasks:
        raise RankError(f"SLURM_PROCID={rank} but the step has {num_tasks} tasks (allowed 0 to {num_tasks - 1})")
    if local_rank >= local_world:
        raise RankError(
            f"SLURM_LOCALID={local_rank} but the node runs {local_world} tasks (allowed 0 to {local_world - 1})"
        )
    return RankInfo(job_id, rank, num_tasks, local_rank, local_world, node_rank, num_nodes, addr, port, restart)
