"""Node-side network checks, run by hpc.node.launch before any process group starts: the exported NCCL/gloo
interfaces and HCAs must exist and be up on this node (ioctls, /proc and sysfs; no external tools), and a libfabric
fabric's provider and NCCL net plugin must be there (hpc/node/fabric.py)."""

from __future__ import annotations

import fcntl
import ipaddress
import re
import socket
import struct
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Mapping, Optional

from hpc.node.cli import NodeCheckError, shown
from hpc.node.contract import (
    DEFAULT_DIST_TIMEOUT_S,
    DIST_TIMEOUT_VAR,
    GLOO_SOCKET_IFNAME_VAR,
    NCCL_IB_DISABLE_VAR,
    NCCL_IB_HCA_VAR,
    NCCL_SOCKET_IFNAME_VAR,
)
from hpc.node.fabric import check_fabric

IB_SYSFS = Path("/sys/class/infiniband")

_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP = 0x8913, 0x8915, 0x1


@dataclass(frozen=True)
class Interface:
    name: str
    addrs: tuple[str, ...]  # IPv4, then IPv6 other than link-local
    up: bool

    def describe(self) -> str:
        state = "" if self.up else ", down"
        return f"{self.name} ({', '.join(self.addrs) or 'no address'}{state})"


@dataclass(frozen=True)
class HcaPort:
    device: str
    port: int
    state: str  # e.g. ACTIVE, DOWN
    rate: str  # e.g. "400 Gb/sec (4X NDR)"

    def describe(self) -> str:
        return f"{self.device}:{self.port} {self.state}"


def _ioctl(sock: socket.socket, request: int, name: str) -> Optional[bytes]:
    try:
        return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None


def _ipv6_addrs() -> dict[str, list[str]]:
    """Non-link-local IPv6 addresses per interface, from /proc/net/if_inet6."""
    out: dict[str, list[str]] = {}
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        hexaddr, _, _, _, _, name = line.split()
        addr = ipaddress.IPv6Address(bytes.fromhex(hexaddr))
        if not addr.is_link_local:
            out.setdefault(name, []).append(str(addr))
    return out


def interfaces() -> list[Interface]:
    """This node's (network namespace's) interfaces, in kernel index order."""
    v6 = _ipv6_addrs()
    result = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in sorted(socket.if_nameindex()):
            addr = _ioctl(s, _SIOCGIFADDR, name)
            flags = _ioctl(s, _SIOCGIFFLAGS, name)
            v4 = [socket.inet_ntoa(addr[20:24])] if addr else []
            up = bool(flags and struct.unpack("H", flags[16:18])[0] & _IFF_UP)
            result.append(Interface(name, tuple(v4 + v6.get(name, [])), up))
    return result


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def hca_ports(root: Path = IB_SYSFS) -> list[HcaPort]:
    """InfiniBand/RoCE HCA ports from sysfs (empty when the node has none)."""
    if not root.is_dir():
        return []
    ports = []
    for dev in sorted(root.iterdir()):
        for port in sorted((dev / "ports").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            if port.name.isdigit():
                state = _read(port / "state").partition(":")[2].strip() or "UNKNOWN"
                ports.append(HcaPort(dev.name, int(port.name), state, _read(port / "rate")))
    return ports


_NAME_PORT = re.compile(r"([A-Za-z0-9_.-]+)(?::([0-9]+))?")


@dataclass(frozen=True)
class NcclList:
    """A parsed NCCL list (NCCL_SOCKET_IFNAME, NCCL_IB_HCA), read as NCCL reads it: one optional leading ``^``
    (exclude) and then one optional ``=`` (exact names instead of prefixes) for the whole list, then ``name[:port]``
    items (names are prefixes otherwise). GLOO_SOCKET_IFNAME is a comma list of exact names instead."""

    exclude: bool
    exact: bool
    items: tuple[tuple[str, Optional[int]], ...]

    @classmethod
    def parse(cls, value: str, var: str) -> "NcclList":
        text = value  # no stripping: a newline or space would reach the script and the node
        exclude = text.startswith("^")
        text = text.removeprefix("^")
        exact = text.startswith("=")
        text = text.removeprefix("=")
        items = []
        for raw in text.split(","):
            m = _NAME_PORT.fullmatch(raw)
            if not m:
                raise NodeCheckError(
                    f"{var}={shown(value)} is not an NCCL list: [^][=]name[:port],... with ^ (exclude) and = (exact "
                    "names) "
                    "once, at the start, for the whole list (e.g. eth0, =eth0, ^docker,lo, mlx5_0:1,mlx5_1:1)"
                )
            items.append((m.group(1), int(m.group(2)) if m.group(2) else None))
        return cls(exclude, exact, tuple(items))

    def listed(self, name: str, port: Optional[int] = None) -> bool:
        return any(
            (name == n if self.exact else name.startswith(n)) and (p is None or port is None or p == port)
            for n, p in self.items
        )

    def selects(self, name: str, port: Optional[int] = None) -> bool:
        return self.listed(name, port) != self.exclude


def _have(ifaces: list[Interface]) -> str:
    return ", ".join(i.describe() for i in ifaces) or "no interfaces"


def _usable(i: Interface) -> bool:
    return i.up and bool(i.addrs)


def check_gloo_ifname(value: str, ifaces: list[Interface]) -> list[Interface]:
    """GLOO_SOCKET_IFNAME: every listed name must be an interface that is up with an address."""
    by_name = {i.name: i for i in ifaces}
    chosen = []
    for name in (n.strip() for n in value.split(",")):
        i = by_name.get(name)
        if i is None:
            raise NodeCheckError(
                f"{GLOO_SOCKET_IFNAME_VAR}={value} but this node has no interface {name}; it has {_have(ifaces)}"
            )
        if not _usable(i):
            raise NodeCheckError(
                f"{GLOO_SOCKET_IFNAME_VAR}={value} but interface {i.describe()} is not up with an address; this node "
                f"has {_have(ifaces)}"
            )
        chosen.append(i)
    return chosen


def check_nccl_ifname(value: str, ifaces: list[Interface]) -> list[Interface]:
    """NCCL_SOCKET_IFNAME: at least one interface it selects must be up with an address."""
    sel = NcclList.parse(value, NCCL_SOCKET_IFNAME_VAR)
    chosen = [i for i in ifaces if sel.selects(i.name) and _usable(i)]
    if not chosen:
        matched = [i for i in ifaces if sel.selects(i.name)]
        what = (
            f"it selects only {_have(matched)}, none up with an address"
            if matched
            else "it selects no interface of this node"
        )
        raise NodeCheckError(f"{NCCL_SOCKET_IFNAME_VAR}={value} but {what}; this node has {_have(ifaces)}")
    return chosen


def check_ib_hca(value: str, ports: list[HcaPort]) -> list[HcaPort]:
    """NCCL_IB_HCA: each listed HCA (or, for ^, some HCA left) must exist with an ACTIVE port."""
    sel = NcclList.parse(value, NCCL_IB_HCA_VAR)
    have = ", ".join(p.describe() for p in ports) or "no InfiniBand/RoCE devices (/sys/class/infiniband is empty)"
    active = [p for p in ports if p.state == "ACTIVE"]
    if sel.exclude:
        chosen = [p for p in active if sel.selects(p.device, p.port)]
        if not chosen:
            raise NodeCheckError(f"{NCCL_IB_HCA_VAR}={value} leaves no HCA port that is ACTIVE; this node has {have}")
        return chosen
    chosen = []
    for name, port in sel.items:
        one = NcclList(False, sel.exact, ((name, port),))
        matched = [p for p in ports if one.listed(p.device, p.port)]
        label = f"{'=' if sel.exact else ''}{name}{f':{port}' if port else ''}"
        if not matched:
            raise NodeCheckError(f"{NCCL_IB_HCA_VAR}={value} but this node has no HCA {label}; it has {have}")
        up = [p for p in matched if p.state == "ACTIVE"]
        if not up:
            raise NodeCheckError(f"{NCCL_IB_HCA_VAR}={value} but HCA {label} has no ACTIVE port; this node has {have}")
        chosen += up
    return chosen


def dist_timeout_s(environ: Mapping[str, str]) -> float:
    """Seconds for rendezvous and each collective: $HPC_DIST_TIMEOUT_S, else the contract's DEFAULT_DIST_TIMEOUT_S."""
    text = environ.get(DIST_TIMEOUT_VAR, str(DEFAULT_DIST_TIMEOUT_S))
    try:
        value = float(text) if text.isascii() and text == text.strip() else 0.0  # float() takes " 1" and other digits
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):  # nan fails both comparisons
        raise NodeCheckError(f"{DIST_TIMEOUT_VAR}={shown(text)} must be a positive number of seconds")
    return value


def bound_every_group(seconds: float) -> timedelta:
    """Make ``seconds`` the timeout of every process group created from now on: the world group, the device mesh's
    groups and each ``new_group`` alike (torch's own default for those is 30 minutes for gloo, 10 for NCCL)."""
    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(seconds=seconds)
    c10d.default_pg_timeout = timeout
    c10d.default_pg_nccl_timeout = timeout
    return timeout


def check_node(
    environ: Mapping[str, str], ifaces: Optional[list[Interface]] = None, ports: Optional[list[HcaPort]] = None
) -> str:
    """Check the exported network settings on this node; returns a one-line summary of what will be used."""
    ifaces = interfaces() if ifaces is None else ifaces
    parts = []
    if environ.get(GLOO_SOCKET_IFNAME_VAR):
        got = check_gloo_ifname(environ[GLOO_SOCKET_IFNAME_VAR], ifaces)
        parts.append(f"gloo {', '.join(i.describe() for i in got)}")
    if environ.get(NCCL_SOCKET_IFNAME_VAR):
        got = check_nccl_ifname(environ[NCCL_SOCKET_IFNAME_VAR], ifaces)
        parts.append(f"nccl socket {', '.join(i.describe() for i in got)}")
    if environ.get(NCCL_IB_HCA_VAR) and environ.get(NCCL_IB_DISABLE_VAR) != "1":
        got = check_ib_hca(environ[NCCL_IB_HCA_VAR], hca_ports() if ports is None else ports)
        parts.append(f"nccl ib {', '.join(p.describe() for p in got)}")
    parts += check_fabric(environ)
    return "; ".join(parts) or "no NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME or NCCL_IB_HCA set: nothing to check"
