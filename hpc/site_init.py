"""``python -m hpc.site init NAME``: a site profile written from the cluster itself, for the user to review.

    python -m hpc.site init NAME [--output FILE] [--force] [--probe-partition P]

It reads Slurm's version, partitions and nodes (`hpc.slurm_inventory`), runs ``python -m hpc.node.inventory`` on one
node of the default partition (``srun -N1``) for its interfaces and HCAs, and writes ./NAME.yaml (never over a file
unless --force): every value with a comment saying where it came from, validated as `hpc.site.load_site` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from pydantic import ValidationError

from hpc.node.cli import HpcError, Parser, fail, path_text, shown
from hpc.node.strict_yaml import YamlError, load_yaml
from hpc.node.tool import ToolMissing, ToolTimeout, run_tool
from hpc.site import NAME_RE, SiteProfile
from hpc.slurm_inventory import Cluster, InventoryError, Node, SlurmPartition, read_cluster
from hpc.slurm_time import parse_minutes

PROG = "hpc.site init"
PROBE_MODULE = "hpc.node.inventory"
PROBE_TIMEOUT_S = 300  # the one-node job may wait in the queue this long
PROBE_MINUTES = 5
MAX_PROBE_CHARS = 2**20


def probe_node(partition: str, python: str, run: Callable = run_tool) -> tuple[str, dict]:
    """One node's interfaces and HCAs through ``srun -N1``: (where they come from, the inventory)."""
    argv = ["srun", "-N1", "-n1", f"--partition={partition}", f"--time={PROBE_MINUTES}", "--job-name=hpc-site-init"]
    argv += ["--quiet", python, "-u", "-m", PROBE_MODULE]
    try:
        r = run(argv, PROBE_TIMEOUT_S)
    except ToolMissing:
        raise InventoryError("srun is not on PATH: run this on a Slurm login node") from None
    except ToolTimeout:
        raise InventoryError(
            f"srun -N1 --partition={partition} got no node within {PROBE_TIMEOUT_S} s: try --probe-partition "
            "with a partition that has idle nodes"
        ) from None
    out = r.stdout[:MAX_PROBE_CHARS]
    line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), "")
    if r.returncode != 0 or not line:
        said = next((x.strip() for x in (r.stderr + out).splitlines() if x.strip()), f"exit code {r.returncode}")
        raise InventoryError(f"srun -N1 --partition={partition} {python} -m {PROBE_MODULE} failed: {shown(said)}")
    try:
        probe = json.loads(line)
    except ValueError:
        raise InventoryError(f"{PROBE_MODULE} printed {shown(line)}, not its JSON line") from None
    return f"node {probe.get('host', '?')} (srun -N1 --partition={partition} python -m {PROBE_MODULE})", probe


def q(value: object) -> str:
    """A YAML scalar: JSON's double-quoted strings are YAML's too."""
    return json.dumps(value)


def partition_lines(p: SlurmPartition, nodes: dict[str, Node], default: bool) -> list[str]:
    mine = [nodes[n] for n in p.nodes if n in nodes]
    if not mine:
        return [f"  # {p.name}: left out, Slurm lists no node of it ({','.join(p.nodes) or 'none'})"]
    gpus, cpus, mem = min(n.gpus for n in mine), min(n.cpus for n in mine), min(n.memory_mb for n in mine)
    types = {n.gpu_type for n in mine}
    features = sorted({f for n in mine for f in n.features})
    hetero = len({(n.gpus, n.cpus, n.memory_mb) for n in mine}) > 1
    max_nodes = p.max_nodes if p.max_nodes is not None else len(mine)
    lines = [
        f"  # {p.name}: {len(mine)} nodes ({mine[0].name}..{mine[-1].name}), state {p.state}, "
        f"Gres {mine[0].gres or 'none'}"
        + (", features " + ",".join(features) if features else "")
        + ("; its nodes differ: the smallest is written" if hetero else ""),
        f"  - name: {q(p.name)}",
    ]
    lines += ["    default: true  # Slurm's Default=YES"] if default else []
    limit = "MaxNodes" if p.max_nodes is not None else "MaxNodes=UNLIMITED: the partition's nodes"
    lines.append(f"    max_nodes: {max_nodes}  # {limit}")
    if gpus:
        lines.append(f"    gpus_per_node: {gpus}  # Gres/CfgTRES gpu")
        if len(types) == 1 and None not in types and re.fullmatch(NAME_RE, types.copy().pop()):
            lines.append(f"    gpu_type: {q(types.pop())}  # the Gres type: the job asks for gpu:TYPE")
    else:
        lines += ["    gpus_per_node: 1  # no GPUs in Slurm: the ranks per node", "    gpu_request: none"]
    lines.append(f"    cpus_per_node: {max(cpus, 1)}  # CPUTot")
    if mem >= 1024:
        lines.append(f"    mem_per_node_gb: {mem // 1024}  # RealMemory={mem} MB, whole GB for sbatch --mem")
    minutes = parse_minutes(p.max_time) if p.max_time.upper() not in ("", "NONE") else None
    lines.append(f"    max_time: {q(p.max_time if minutes is not None else 'UNLIMITED')}  # MaxTime={p.max_time}")
    if gpus:
        lines.append(
            "    # gpu_memory_gb: set it (Slurm does not know it) so the planner can choose tp and checkpointing"
        )
    return lines


def network_lines(probe: dict, where: str) -> list[str]:
    ifaces = [i for i in probe.get("interfaces", []) if i.get("name") and i["name"] != "lo"]
    usable = [i for i in ifaces if i.get("up") and i.get("addrs")]
    hcas = [h for h in probe.get("hcas", []) if h.get("state") == "ACTIVE"]
    seen = ", ".join(f"{i['name']} ({', '.join(i.get('addrs') or ['no address'])})" for i in ifaces) or "none but lo"
    lines = ["network:", f"  # from {where}: interfaces {seen}"]
    lines.append(
        "  # HCA ports "
        + ", ".join(
            f"{h['device']}:{h['port']} {h['state']} {h.get('link_layer') or ''}".strip() for h in probe.get("hcas", [])
        )  # fmt: skip
        if probe.get("hcas")
        else "  # no InfiniBand/RoCE HCA (/sys/class/infiniband is empty)"
    )
    names = [i["name"] for i in usable]
    hsn = [n for n in names if n.startswith("hsn")]
    first = hsn[0] if hsn else (names[0] if names else "lo")
    ib = [h for h in hcas if h.get("link_layer") == "InfiniBand"]
    roce = [h for h in hcas if h.get("link_layer") == "Ethernet"]
    if hsn:
        fabric = "slingshot  # hsn* interfaces: HPE Slingshot; NCCL needs the aws-ofi-nccl plugin (docs/network.md)"
    elif ib:
        fabric = "infiniband"
    elif roce:
        fabric = "roce"
    elif names:
        fabric = "ethernet"
    else:
        fabric = "loopback  # no interface but lo: one node only"
    lines += [
        f"  fabric: {fabric}",
        f"  nccl_socket_ifname: {q('hsn' if hsn else first)}  # NCCL's bootstrap (and data without an HCA)",
        f"  gloo_socket_ifname: {q(first)}",
    ]
    if ib or roce:
        lines.append(
            f"  ib_hca: [{', '.join(q(d) for d in sorted({h['device'] for h in ib or roce}))}]  # ACTIVE ports"
        )
    if roce and not ib:
        lines.append("  roce_gid_index: 3  # RoCE v2's usual index: check it with show_gids on a node")
    return lines


def profile_text(name: str, cluster: Cluster, probe: dict, where: str, slurm_conf: Optional[str]) -> str:
    default = next((p.name for p in cluster.partitions if p.default), cluster.partitions[0].name)
    lines = [
        f"# Site profile {name}: written by python -m hpc.site init from Slurm {cluster.version}. Review every value",
        "# (docs/sites.md describes the keys), add what Slurm cannot say (gpu_memory_gb, network.expected,",
        "# environment.setup for the nodes' venv or modules), then:",
        f"# python -m hpc.submit --site {name} --nodes 1 --dry-run",
        f"name: {q(name)}",
        f"description: {q(f'Slurm {cluster.version} cluster, profile written from the cluster (hpc.site init)')}",
    ]
    if slurm_conf:
        lines += ["submission:", f"  slurm_conf: {q(slurm_conf)}  # SLURM_CONF when this was written"]
    lines.append("partitions:")
    for p in cluster.partitions:
        lines += partition_lines(p, cluster.nodes, p.name == default)
    lines += network_lines(probe, where)
    return "\n".join(lines) + "\n"


def write_profile(path: Path, text: str, force: bool) -> None:
    """Validate ``text`` as a profile, then write it to ``path`` whole (a temporary file renamed over it)."""
    try:
        SiteProfile.model_validate(load_yaml(text, str(path)))
    except (YamlError, ValidationError) as e:  # a cluster this cannot describe: say what, write nothing
        said = " ".join(str(e).split())[:300]
        raise HpcError(f"the profile written from this cluster does not validate ({said})") from None
    if path.exists() and not force:
        raise HpcError(f"{path} exists: pass --force to replace it, or --output another file")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m hpc.site", description="Site profiles: write one from the cluster itself.")
    sub = p.add_subparsers(dest="command", required=True, metavar="init")
    init = sub.add_parser("init", help=__doc__.split("\n")[0], description=__doc__.split("\n")[0])
    init.add_argument("name", type=path_text, help="the profile's name: letters, digits, '.', '_' and '-'")
    init.add_argument("--output", type=path_text, metavar="FILE", help="where to write it (default ./NAME.yaml)")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.add_argument(
        "--probe-partition", metavar="P", help="the partition of the one-node probe (default: Slurm's default)"
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if not re.fullmatch(NAME_RE, a.name) or len(a.name) > 200:
        p.error(f"NAME {shown(a.name)}: allowed are letters, digits, '.', '_' and '-' (at most 200)")
    path = Path(a.output or f"{a.name}.yaml")
    if path.exists() and not a.force:
        fail(PROG, f"{path} exists: pass --force to replace it, or --output another file")
    if not path.parent.is_dir():
        fail(PROG, f"--output {path}: folder {path.parent} does not exist")
    try:
        cluster = read_cluster()
        names = [x.name for x in cluster.partitions]
        part = a.probe_partition or next((x.name for x in cluster.partitions if x.default), names[0])
        if part not in names:
            raise HpcError(
                f"--probe-partition {shown(part)}: not a partition of this cluster; allowed: {', '.join(names)}"
            )
        where, probe = probe_node(part, sys.executable)
        text = profile_text(a.name, cluster, probe, where, os.environ.get("SLURM_CONF"))
        write_profile(path, text, a.force)
    except HpcError as e:
        fail(PROG, e)
    print(f"wrote {path}: review it, then python -m hpc.submit --site {path} --nodes 1 --dry-run")
