"""Node-side checks of a libfabric fabric (AWS EFA, HPE Slingshot), run with the interface checks before any rank
starts: libfabric's provider in FI_PROVIDER must be listed by ``fi_info -p PROVIDER`` on this node, and the NCCL net
plugin that NCCL_NET_PLUGIN names (or NCCL's default, libnccl-net.so, when NCCL_NET names a plugin's net) must load
as NCCL loads it and export a ``ncclNetPlugin_v*`` table."""

from __future__ import annotations

import ctypes
import os
import shutil
from typing import Callable, Mapping, Optional

from hpc.node.cli import NodeCheckError
from hpc.node.contract import FABRIC_MIN_VAR, FI_PROVIDER_VAR, NCCL_NET_PLUGIN_VAR, NCCL_NET_VAR
from hpc.node.fabric_versions import check_versions, node_versions
from hpc.node.tool import ToolTimeout, run_tool

FI_INFO_TIMEOUT_S = 60
BUILTIN_NETS = ("IB", "Socket")  # NCCL_NET values NCCL serves itself, without a plugin
PLUGIN_VERSIONS = range(11, 1, -1)  # ncclNetPlugin_v11 ... _v2


def provider_domains(text: str, provider: str) -> list[str]:
    """The domains ``fi_info -p PROVIDER`` lists for ``provider`` itself (not for a provider layered on another,
    ``tcp;ofi_rxm``), in order, each once."""
    domains: list[str] = []
    current = None
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "provider":
            current = value.strip()
        elif key == "domain" and current == provider and value.strip() not in domains:
            domains.append(value.strip())
    return domains


def check_provider(value: str, run: Callable = run_tool, which: Callable = shutil.which) -> list[str]:
    """FI_PROVIDER: each provider it names (not an exclusion, ``^tcp``) must be listed by ``fi_info -p`` here."""
    if value.startswith("^"):
        return []
    found = []
    for provider in (p.strip() for p in value.split(",")):
        if which("fi_info") is None:
            raise NodeCheckError(
                f"{FI_PROVIDER_VAR}={value} but fi_info (libfabric's tool) is not on PATH on this node, "
                "so the provider cannot be seen: put libfabric's bin directory on PATH in the profile's "
                "environment.setup (e.g. /opt/amazon/efa/bin on AWS)"
            )
        try:
            r = run(["fi_info", "-p", provider], FI_INFO_TIMEOUT_S)
        except ToolTimeout:
            raise NodeCheckError(
                f"{FI_PROVIDER_VAR}={value}: fi_info -p {provider} got no answer within {FI_INFO_TIMEOUT_S} s"
            ) from None
        domains = provider_domains(r.stdout, provider) if r.returncode == 0 else []
        if not domains:
            said = next(
                (line.strip() for line in (r.stderr + r.stdout).splitlines() if line.strip()),
                f"exit code {r.returncode}",
            )
            raise NodeCheckError(
                f"{FI_PROVIDER_VAR}={value} but fi_info -p {provider} lists no {provider} device on this node "
                f"({said}): its driver or libfabric's {provider} provider is missing here"
            )
        found.append(f"libfabric {provider}: {', '.join(domains)}")
    return found


def plugin_names(plugin: Optional[str]) -> list[str]:
    """The libraries NCCL tries for NCCL_NET_PLUGIN, in its order: the value as given, then libnccl-net-VALUE.so for a
    bare suffix (no /, not lib*.so); libnccl-net.so when it is unset."""
    if not plugin:
        return ["libnccl-net.so"]
    bare = "/" not in plugin and not (plugin.startswith("lib") and plugin.endswith(".so"))
    return [plugin, f"libnccl-net-{plugin}.so"] if bare else [plugin]


def load_plugin(plugin: Optional[str], load: Callable = ctypes.CDLL) -> tuple[str, int]:
    """Load the NCCL net plugin as NCCL does (dlopen, RTLD_NOW | RTLD_LOCAL); the path-or-name that loaded and the
    newest ncclNetPlugin_v* it exports. NodeCheckError naming what NCCL would not find or load."""
    errors = []
    for name in plugin_names(plugin):
        try:
            lib = load(name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            errors.append(str(e))
            continue
        version = next((v for v in PLUGIN_VERSIONS if hasattr(lib, f"ncclNetPlugin_v{v}")), None)
        if version is None:
            raise NodeCheckError(
                f"{NCCL_NET_PLUGIN_VAR}={plugin}: {name} loads but is not an NCCL net plugin "
                "(it exports no ncclNetPlugin_v* table)"
            )
        return name, version
    what = (
        f"{NCCL_NET_PLUGIN_VAR}={plugin}"
        if plugin
        else f"{NCCL_NET_VAR} names a plugin's net and {NCCL_NET_PLUGIN_VAR} is unset"
    )
    raise NodeCheckError(
        f"{what}, but the NCCL net plugin does not load on this node ({'; '.join(errors)}): install "
        "aws-ofi-nccl there, or give its library's path as network.nccl_net_plugin"
    )


def check_fabric(
    environ: Mapping[str, str],
    run: Callable = run_tool,
    which: Callable = shutil.which,
    load: Callable = ctypes.CDLL,
    versions: Callable = node_versions,
) -> list[str]:
    """What this node's libfabric fabric offers, one summary per check ([] when FI_PROVIDER, NCCL_NET_PLUGIN and a
    plugin's NCCL_NET are all unset); with FABRIC_MIN_VAR set (an efa or slingshot job) the plugin's, libfabric's and
    NCCL's versions too (`hpc.node.fabric_versions`)."""
    found = check_provider(environ[FI_PROVIDER_VAR], run, which) if environ.get(FI_PROVIDER_VAR) else []
    plugin, net = environ.get(NCCL_NET_PLUGIN_VAR), environ.get(NCCL_NET_VAR)
    loaded = None
    if (plugin and plugin.lower() != "none") or (net and net not in BUILTIN_NETS and not plugin):
        loaded, version = load_plugin(plugin, load)
        found.append(f"nccl net plugin {loaded} (ncclNetPlugin_v{version})")
    if FABRIC_MIN_VAR in environ:
        found.append(check_versions(environ, versions(environ, loaded, run)))
    return found
