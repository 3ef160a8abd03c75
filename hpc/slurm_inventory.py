"""What a Slurm cluster says about itself, for ``python -m hpc.site init``: its version (``scontrol --version``), its
partitions (``scontrol show partition -o``, ``sinfo``) and nodes (``scontrol show node -o``: CPUs, RealMemory,
features, GPUs from Gres or CfgTRES). The clients' output is read bounded (a timeout, a size cap, undecodable bytes
replaced); a client that fails or is missing is one `InventoryError` line."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

import hostlist

from hpc.node.cli import HpcError, shown
from hpc.node.tool import ToolMissing, ToolTimeout, run_tool
from hpc.slurm_query import check_controller, parse_scontrol

CLIENT_TIMEOUT_S = 30
MAX_OUTPUT_CHARS = 16 * 2**20


class InventoryError(HpcError):
    """Slurm cannot be asked, or says something this cannot use; one line."""


def run_client(argv: list[str], run: Callable = run_tool, timeout_s: float = CLIENT_TIMEOUT_S) -> str:
    """A Slurm client's stdout (at most MAX_OUTPUT_CHARS); InventoryError naming the command and what it said."""
    try:
        r = run(argv, timeout_s)
    except ToolMissing:
        raise InventoryError(f"{argv[0]} is not on PATH: run this on a Slurm login node") from None
    except ToolTimeout:
        raise InventoryError(f"{' '.join(argv)} got no answer within {timeout_s:g} s: is slurmctld up?") from None
    if r.returncode != 0:
        said = next((line.strip() for line in r.stderr.splitlines() if line.strip()), f"exit code {r.returncode}")
        raise InventoryError(
            f"{' '.join(argv)} failed: {shown(said)} (is Slurm reachable? SLURM_CONF names its config)"
        )
    return r.stdout[:MAX_OUTPUT_CHARS]


def slurm_version(text: str) -> str:
    """``slurm 24.11.5`` or ``slurm-wlm 22.05.8`` -> the version."""
    m = re.search(r"\b(\d+\.\d+(?:\.\d+)?)", text)
    if not m:
        raise InventoryError(f"scontrol --version said {shown(text.strip())}: no version in it")
    return m.group(1)


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int
    gpu_type: Optional[str]
    features: tuple[str, ...]
    gres: str


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    default: bool
    max_nodes: Optional[int]  # None: UNLIMITED
    max_time: str
    nodes: tuple[str, ...]
    state: str


def _int(value: str) -> int:
    m = re.match(r"\d+", value or "")
    return int(m.group()) if m else 0


def gpus_of(gres: str, cfg_tres: str) -> tuple[int, Optional[str]]:
    """A node's GPU count and type: CfgTRES ``gres/gpu=N`` where accounting tracks it, else the sum of its Gres
    ``gpu[:TYPE]:N[(S:...)]`` entries; the type where every entry names the same one."""
    entries = [e for e in re.split(r",(?![^(]*\))", gres or "") if e.split(":")[0] == "gpu"]
    counts, types = 0, set()
    for entry in entries:
        parts = re.sub(r"\(.*\)$", "", entry).split(":")
        counts += _int(parts[-1])
        types.add(parts[1] if len(parts) == 3 else None)
    tres = re.search(r"(?:^|,)gres/gpu=(\d+)", cfg_tres or "")
    count = int(tres.group(1)) if tres else counts
    return count, (types.pop() if len(types) == 1 else None)


def parse_nodes(text: str) -> dict[str, Node]:
    nodes = {}
    for line in filter(str.strip, text.splitlines()):
        f = {k: v.strip() for k, v in parse_scontrol(line).items()}
        if "NodeName" not in f:
            continue
        gpus, gpu_type = gpus_of(f.get("Gres", ""), f.get("CfgTRES", ""))
        features = tuple(x for x in f.get("AvailableFeatures", "").split(",") if x and x != "(null)")
        nodes[f["NodeName"]] = Node(
            f["NodeName"], _int(f.get("CPUTot", "")), _int(f.get("RealMemory", "")), gpus, gpu_type, features,
            f.get("Gres", ""),
        )  # fmt: skip
    return nodes


def parse_partitions(text: str) -> list[SlurmPartition]:
    parts = []
    for line in filter(str.strip, text.splitlines()):
        f = {k: v.strip() for k, v in parse_scontrol(line).items()}
        if "PartitionName" not in f:
            continue
        nodes = f.get("Nodes", "")
        try:
            names = tuple(hostlist.expand_hostlist(nodes)) if nodes and nodes != "(null)" else ()
        except hostlist.BadHostlist:
            raise InventoryError(
                f"partition {f['PartitionName']}: Nodes={shown(nodes)} is not a Slurm hostlist"
            ) from None
        max_nodes = f.get("MaxNodes", "UNLIMITED")
        parts.append(
            SlurmPartition(
                f["PartitionName"],
                f.get("Default") == "YES",
                None if not max_nodes.isdigit() else int(max_nodes),
                f.get("MaxTime", "UNLIMITED"),
                names,
                f.get("State", ""),
            )  # fmt: skip
        )
    return parts


@dataclass(frozen=True)
class Cluster:
    version: str
    partitions: list[SlurmPartition]
    nodes: dict[str, Node]


def read_cluster(run: Callable = run_tool, environ: Mapping[str, str] = os.environ) -> Cluster:
    """Ask Slurm's clients (after seconds-long checks that SLURM_CONF exists and slurmctld answers: the clients
    themselves retry for long); InventoryError when one fails or the cluster has no partition."""
    conf = environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        raise InventoryError(f"SLURM_CONF={shown(conf)} does not exist: point it at the cluster's slurm.conf")
    check_controller(environ)
    version = slurm_version(run_client(["scontrol", "--version"], run))
    partitions = parse_partitions(run_client(["scontrol", "show", "partition", "-o"], run))
    listed = {line.split("|")[0] for line in run_client(["sinfo", "-h", "-o", "%R|%a"], run).splitlines() if line}
    partitions = [p for p in partitions if p.name in listed or not listed]
    if not partitions:
        raise InventoryError("Slurm lists no partition (scontrol show partition, sinfo): nothing to write a profile of")
    return Cluster(version, partitions, parse_nodes(run_client(["scontrol", "show", "node", "-o"], run)))
