"""How a partition asks Slurm for GPUs and binds tasks to them and to CPUs (a profile's partitions[] keys
``gpu_request``, ``gpu_bind``, ``cpu_bind``, ``gres_flags``), and the sbatch and srun options that follow.

Sites differ: one rejects ``--gpus`` and wants ``--gpus-per-node``, another only takes ``--gres=gpu:N``, a CPU
partition takes none; LUMI-like sites bind each task to its GPU (``--gpu-bind=map_gpu:...``) and need
``--gres-flags=allow-task-sharing`` (srun only, Slurm 23.11+) so NCCL still reaches the node's other GPUs.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from hpc.node.cli import shown

GpuRequest = Literal["gpus-per-node", "gres", "gpus", "none"]

_LIST = r"[0-9]+(?:\*[0-9]+)?(?:,[0-9]+(?:\*[0-9]+)?)*"  # map_gpu:0,1 or 0*4,1*4
_MASKS = r"(?:0x)?[0-9A-Fa-f]+(?:\*[0-9]+)?(?:,(?:0x)?[0-9A-Fa-f]+(?:\*[0-9]+)?)*"
GPU_BIND_RE = re.compile(
    rf"(?:verbose,)?(?:closest|none|map_gpu:{_LIST}|mask_gpu:{_MASKS}|per_task:[1-9][0-9]*|single:[1-9][0-9]*)"
)
CPU_BIND_RE = re.compile(
    rf"(?:(?:quiet|verbose),)?(?:none|no|rank|rank_ldom|boards|sockets|cores|threads|ldoms|"
    rf"map_cpu:{_LIST}|mask_cpu:{_MASKS}|map_ldom:{_LIST}|mask_ldom:{_MASKS})"
)
GPU_BIND_FORMS = "closest, none, map_gpu:LIST, mask_gpu:MASKS, per_task:N, single:N, each optionally after verbose,"
CPU_BIND_FORMS = (
    "none, rank, cores, sockets, threads, ldoms, boards, rank_ldom, map_cpu:LIST, mask_cpu:MASKS, "
    "map_ldom:LIST, mask_ldom:MASKS, each optionally after quiet, or verbose,"
)
SRUN_GRES_FLAGS = ("allow-task-sharing",)  # srun only (sbatch refuses it): on the ranks' srun line
JOB_GRES_FLAGS = ("enforce-binding", "disable-binding", "one-task-per-sharing", "multiple-tasks-per-sharing")
GRES_FLAGS = SRUN_GRES_FLAGS + JOB_GRES_FLAGS
EXCLUSIVE_GRES_FLAGS = (("enforce-binding", "disable-binding"), ("one-task-per-sharing", "multiple-tasks-per-sharing"))


def check_gpu_bind(value: str) -> str:
    if not GPU_BIND_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a Slurm --gpu-bind value; allowed: {GPU_BIND_FORMS}")
    return value


def check_cpu_bind(value: str) -> str:
    if not CPU_BIND_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a Slurm --cpu-bind value; allowed: {CPU_BIND_FORMS}")
    return value


def check_gres_flags(flags: list[str]) -> list[str]:
    for flag in flags:
        if flag not in GRES_FLAGS:
            raise ValueError(f"{shown(flag)} is not a Slurm --gres-flags value; allowed: {', '.join(GRES_FLAGS)}")
    if len(set(flags)) != len(flags):
        raise ValueError("a flag is listed twice")
    for a, b in EXCLUSIVE_GRES_FLAGS:
        if a in flags and b in flags:
            raise ValueError(f"{a} and {b} exclude each other")
    return flags


def gpu_count(kind: Optional[str], gpus: int) -> str:
    """``N`` or ``TYPE:N``, as --gpus-per-node and --gpus take it."""
    return f"{kind}:{gpus}" if kind else str(gpus)


def job_gpu_options(request: str, kind: Optional[str], gpus_per_node: int, allocated_nodes: int) -> dict[str, str]:
    """The option that asks for the job's GPUs, in the partition's form ({} for a CPU partition): the one request of
    the job, written as its #SBATCH line and on every step that asks for GPUs (the health step, over all of the
    allocation's nodes). ``allocated_nodes`` counts the spares too, so ``--gpus`` (the job's total) gives each node of
    the allocation its GPUs and a spare taking a node's place has them. With --ntasks-per-node Slurm may still spread
    ``--gpus`` unevenly, which each node's hpc.node.launch names (its GPUs against its tasks)."""
    if request == "gpus-per-node":
        return {"gpus-per-node": gpu_count(kind, gpus_per_node)}
    if request == "gres":
        return {"gres": f"gpu:{kind}:{gpus_per_node}" if kind else f"gpu:{gpus_per_node}"}
    if request == "gpus":
        return {"gpus": gpu_count(kind, gpus_per_node * allocated_nodes)}
    return {}
