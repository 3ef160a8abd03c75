"""The versions an AWS EFA or HPE Slingshot job depends on (the aws-ofi-nccl plugin, libfabric, NCCL), the minimums
the fabric presets rely on, and how a node learns its own: ``fi_info --version`` for libfabric, the plugin library's
``aws-ofi-nccl X.Y.Z`` string (its PACKAGE_STRING, which it logs at start) for the plugin, and the installed
``nvidia-nccl-cu*`` distribution (the NCCL torch loads) or a ``libnccl.so.2.X.Y`` on the library path for NCCL.

aws-ofi-nccl's documentation: from plugin 1.7 on libfabric 1.18 no ``FI_*`` variable is needed (``FI_PROVIDER=efa``,
``FI_EFA_USE_DEVICE_RDMA=1`` were for plugins up to 1.5/1.6); p5 instances need NCCL 2.18.5 and plugin 1.7.3."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Mapping, Optional

from hpc.node.cli import NodeCheckError
from hpc.node.contract import FABRIC_MIN_VAR
from hpc.node.files import NotASmallFile, read_range
from hpc.node.tool import run_tool

PLUGIN, LIBFABRIC, NCCL = "aws-ofi-nccl", "libfabric", "nccl"
# the newest plugin and libfabric that still need FI_PROVIDER / FI_EFA_USE_DEVICE_RDMA: below these the preset sets them
NO_FI_ENV_FROM = {PLUGIN: (1, 7), LIBFABRIC: (1, 18)}
P5_MIN = {NCCL: (2, 18, 5), PLUGIN: (1, 7, 3)}  # p5.48xlarge, p5e, p5en
SLINGSHOT_NO_LL128_FROM = (2, 27)  # NCCL enables LL128 by default from 2.27; CSCS turns it off on Slingshot
DMI_PRODUCT = Path("/sys/devices/virtual/dmi/id/product_name")  # an EC2 instance's type, e.g. p5.48xlarge
FI_INFO_TIMEOUT_S = 60
SYSTEM_LIB_DIRS = (
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib",
    "/usr/local/lib",
)
SCAN_BYTES = 64 * 2**20  # the most of a plugin library read for its version string
_VERSION = re.compile(r"^(\d+)((?:\.\d+){0,3})")


def parse_version(text: str) -> Optional[tuple[int, ...]]:
    """The leading dotted numbers of ``text`` ("1.18.2amzn1.0" -> (1, 18, 2)); None when it starts with none."""
    m = _VERSION.match(text.strip())
    return tuple(int(p) for p in (m.group(1) + m.group(2)).split(".")) if m else None


def shown_version(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def older(have: tuple[int, ...], need: tuple[int, ...]) -> bool:
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) < need + (0,) * (width - len(need))


def format_minimums(minimums: Mapping[str, tuple[int, ...]]) -> str:
    """``FABRIC_MIN_VAR``'s value: ``aws-ofi-nccl=1.7,libfabric=1.18``."""
    return ",".join(f"{name}={shown_version(v)}" for name, v in minimums.items())


def parse_minimums(value: str) -> dict[str, tuple[int, ...]]:
    """``FABRIC_MIN_VAR``'s value back; NodeCheckError for a value the login side never writes."""
    out = {}
    for item in filter(None, value.split(",")):
        name, _, version = item.partition("=")
        parsed = parse_version(version)
        if name not in (PLUGIN, LIBFABRIC, NCCL) or parsed is None:
            raise NodeCheckError(
                f"{FABRIC_MIN_VAR}={value}: {item!r} is not NAME=VERSION of {PLUGIN}, {LIBFABRIC}, {NCCL}"
            )
        out[name] = parsed
    return out


def libfabric_version(run: Callable = run_tool) -> Optional[tuple[int, ...]]:
    """libfabric's version from ``fi_info --version`` ("libfabric: 1.18.2amzn1.0"); None when it cannot be told (the
    tool missing or past its timeout too)."""
    try:
        r = run(["fi_info", "--version"], FI_INFO_TIMEOUT_S)
    except OSError:  # ToolMissing, ToolTimeout
        return None
    m = re.search(r"^libfabric:\s*(\S+)", r.stdout[:4096], re.M) if r.returncode == 0 else None
    return parse_version(m.group(1)) if m else None


def plugin_version(path: Optional[str]) -> Optional[tuple[int, ...]]:
    """The aws-ofi-nccl version compiled into the plugin library at ``path`` (its "aws-ofi-nccl 1.9.1-aws" string)."""
    if not path:
        return None
    try:
        data, _ = read_range(path, 0, SCAN_BYTES)
    except (OSError, NotASmallFile):
        return None
    m = re.search(rb"aws-ofi-nccl (\d+(?:\.\d+){1,3})", data)
    return parse_version(m.group(1).decode()) if m else None


def nccl_version(environ: Mapping[str, str]) -> Optional[tuple[int, ...]]:
    """NCCL's version: the installed nvidia-nccl-cu* distribution torch loads it from, else the newest
    ``libnccl.so.2.X.Y`` in LD_LIBRARY_PATH's folders."""
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return parse_version(metadata.version(dist))
        except metadata.PackageNotFoundError:
            continue
    found = []
    for folder in filter(None, environ.get("LD_LIBRARY_PATH", "").split(":")):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found += [
            parse_version(n[len("libnccl.so.") :]) for n in names if re.fullmatch(r"libnccl\.so\.\d+\.\d+\.\d+", n)
        ]
    return max(found) if found else None


def library_path(name: str, environ: Mapping[str, str]) -> Optional[str]:
    """The file ``dlopen(name)`` finds, looked up as the dynamic loader does for a bare name: LD_LIBRARY_PATH's
    folders, then the system's (None when neither holds it, e.g. a name found through an RPATH)."""
    if "/" in name:
        return name
    folders = [*filter(None, environ.get("LD_LIBRARY_PATH", "").split(":")), *SYSTEM_LIB_DIRS]
    return next((str(Path(d) / name) for d in folders if (Path(d) / name).is_file()), None)


def node_versions(environ: Mapping[str, str], plugin: Optional[str], run: Callable = run_tool) -> Found:
    """This node's plugin (the library ``plugin`` names, as NCCL loads it), libfabric and NCCL versions."""
    path = library_path(plugin, environ) if plugin else None
    return Found(plugin_version(path), libfabric_version(run), nccl_version(environ), is_p5())


def is_p5(product: Path = DMI_PRODUCT) -> bool:
    try:
        data, _ = read_range(product, 0, 200)
    except (OSError, NotASmallFile):
        return False
    return data.decode("utf-8", errors="replace").strip().startswith("p5")


@dataclass(frozen=True)
class Found:
    """What this node runs; None where it cannot be told."""

    plugin: Optional[tuple[int, ...]]
    libfabric: Optional[tuple[int, ...]]
    nccl: Optional[tuple[int, ...]]
    p5: bool = False

    def by_name(self) -> dict[str, Optional[tuple[int, ...]]]:
        return {PLUGIN: self.plugin, LIBFABRIC: self.libfabric, NCCL: self.nccl}


def check_versions(environ: Mapping[str, str], found: Found) -> str:
    """The node's versions against the minimums the job was rendered for (FABRIC_MIN_VAR) and, on p5, p5's; a summary,
    or a NodeCheckError naming every version older than its minimum in one line."""
    minimums = parse_minimums(environ.get(FABRIC_MIN_VAR, ""))
    if found.p5:
        for name, need in P5_MIN.items():
            minimums[name] = max(minimums.get(name, need), need)
    have = found.by_name()
    old = [
        f"{name} {shown_version(have[name])} is older than {shown_version(need)}"
        for name, need in minimums.items()
        if have[name] is not None and older(have[name], need)
    ]
    if old:
        why = " (p5 needs NCCL 2.18.5 and aws-ofi-nccl 1.7.3)" if found.p5 else ""
        raise NodeCheckError(
            f"{'; '.join(old)} on this node{why}: the job's fabric settings rely on it; install a newer one there, or "
            "declare the versions the site runs in the profile's network.versions (the preset then sets the FI_* "
            "variables they need)"
        )
    return "versions " + ", ".join(f"{name} {shown_version(v) if v else 'unknown'}" for name, v in have.items())
