"""A partition's GPU binding (``gpu_bind``: srun --gpu-bind of the ranks) against the node's GPUs and the job's ranks
per node: every GPU index a map names or a mask holds exists on the node and among the GPUs the job asks for, none is
named twice (two ranks on one GPU), no mask is empty, and a map or mask list gives each rank of the node its entry.
`check_partition_bind` runs when the profile is loaded, `check_job_bind` when hpc.submit builds the job."""

from __future__ import annotations

from typing import Optional

from hpc.node.cli import shown


def _expand(items: str) -> list[str]:
    """``0*2,1`` -> ['0', '0', '1'] (Slurm's ``*count`` repeats an entry)."""
    out = []
    for item in items.split(","):
        value, _, count = item.partition("*")
        out += [value] * (int(count) if count else 1)
    return out


def bind_gpus(gpu_bind: str) -> Optional[list[set[int]]]:
    """The GPU indices of each rank of a map_gpu or mask_gpu binding, in rank order; None for the other forms."""
    body = gpu_bind.removeprefix("verbose,")
    kind, _, items = body.partition(":")
    if kind == "map_gpu":
        return [{int(v)} for v in _expand(items)]
    if kind == "mask_gpu":
        return [{bit for bit in range(int(v, 16).bit_length()) if int(v, 16) >> bit & 1} for v in _expand(items)]
    return None


def check_partition_bind(gpu_bind: str, gpus_per_node: int) -> None:
    """ValueError naming what is wrong when the binding names a GPU the node lacks, one twice, or an empty mask."""
    try:
        _check_on_node(gpu_bind, gpus_per_node)
    except ValueError as e:
        raise ValueError(f"gpu_bind {e}") from None


def _check_on_node(gpu_bind: str, gpus_per_node: int) -> None:
    ranks = bind_gpus(gpu_bind)
    if ranks is None:
        count = gpu_bind.removeprefix("verbose,").partition(":")[2]
        if count and int(count) > gpus_per_node:
            raise ValueError(f"{shown(gpu_bind)} asks for {count} GPUs per task; the node has {gpus_per_node}")
        return
    if any(not r for r in ranks):
        raise ValueError(f"{shown(gpu_bind)}: mask {ranks.index(set()) + 1} holds no GPU")
    beyond = sorted({i for r in ranks for i in r if i >= gpus_per_node})
    if beyond:
        raise ValueError(
            f"{shown(gpu_bind)} names GPU {beyond[0]}; the node has GPUs 0 to {gpus_per_node - 1} (gpus_per_node "
            f"{gpus_per_node})"
        )
    seen: set[int] = set()
    for r in ranks:
        twice = r & seen
        if twice:
            raise ValueError(f"{shown(gpu_bind)} binds GPU {min(twice)} to two ranks; each GPU once")
        seen |= r


def check_job_bind(gpu_bind: str, gpus: int, tasks_per_node: int) -> None:
    """The binding against the job's ``gpus`` per node and ``tasks_per_node`` ranks on each: ValueError when it names
    a GPU the job does not ask for, or its list has another length than the node's ranks."""
    ranks = bind_gpus(gpu_bind)
    if ranks is None:
        count = gpu_bind.removeprefix("verbose,").partition(":")[2]
        if gpu_bind.removeprefix("verbose,").startswith("per_task:") and int(count) * tasks_per_node > gpus:
            raise ValueError(
                f"gpu_bind {shown(gpu_bind)}: {tasks_per_node} ranks x {count} GPUs is more than the job's {gpus} per "
                "node"
            )
        return
    beyond = sorted({i for r in ranks for i in r if i >= gpus})
    if beyond:
        raise ValueError(
            f"gpu_bind {shown(gpu_bind)} names GPU {beyond[0]}; the job asks for {gpus} per node (GPUs 0 to {gpus - 1})"
        )
    if len(ranks) != tasks_per_node:
        raise ValueError(
            f"gpu_bind {shown(gpu_bind)} binds {len(ranks)} rank(s) per node; the job runs {tasks_per_node} (one entry "
            "per rank)"
        )
