"""A site's network settings as the environment variables NCCL and gloo read."""

from __future__ import annotations

from typing import Optional

from hpc.node.contract import (
    FABRIC_MIN_VAR,
    FI_PROVIDER_VAR,
    GLOO_SOCKET_IFNAME_VAR,
    NCCL_IB_DISABLE_VAR,
    NCCL_IB_GID_INDEX_VAR,
    NCCL_IB_HCA_VAR,
    NCCL_NET_GDR_LEVEL_VAR,
    NCCL_NET_PLUGIN_VAR,
    NCCL_NET_VAR,
    NCCL_SOCKET_IFNAME_VAR,
    OFI_NET_NAME,
)
from hpc.node.fabric_versions import (
    LIBFABRIC,
    NO_FI_ENV_FROM,
    PLUGIN,
    SLINGSHOT_NO_LL128_FROM,
    format_minimums,
    older,
    parse_version,
)
from hpc.site import FabricVersions, Network

# libfabric's provider of each fabric NCCL reaches through the aws-ofi-nccl plugin
PROVIDERS = {"efa": "efa", "slingshot": "cxi"}
# HPE Slingshot (CXI) settings for NCCL as CSCS publishes them for Alps' GH200 nodes (eth-cscs/cscs-docs,
# docs/software/communication/nccl_env_vars): larger completion and transmit queues, software tag matching, no host
# registration, the userfaultfd memory-registration cache monitor, any NIC for a ring. HPE's own set and Isambard-AI's
# differ (FI_CXI_DEFAULT_TX_SIZE 2048, hybrid matching, alt_read rendezvous, which needs srun
# --network=disable_rdzv_get): docs/network.md says why this one.
SLINGSHOT_ENV = {
    "NCCL_CROSS_NIC": "1",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "FI_CXI_DEFAULT_TX_SIZE": "32768",
    "FI_CXI_DISABLE_HOST_REGISTER": "1",
    "FI_CXI_RX_MATCH_MODE": "software",
    "FI_MR_CACHE_MONITOR": "userfaultfd",
}
NO_LL128 = {"NCCL_PROTO": "^LL128"}  # Slingshot, NCCL 2.27 and newer (LL128 on by default): CSCS turns it off


def declared(text: Optional[str]) -> Optional[tuple[int, ...]]:
    return parse_version(text) if text else None


def needs_fi_env(versions: FabricVersions) -> bool:
    """Whether the profile declares a plugin or libfabric older than those from which no FI_* variable is needed."""
    plugin, libfabric = declared(versions.aws_ofi_nccl), declared(versions.libfabric)
    return bool(
        plugin and older(plugin, NO_FI_ENV_FROM[PLUGIN]) or libfabric and older(libfabric, NO_FI_ENV_FROM[LIBFABRIC])
    )


def libfabric_env(net: Network) -> dict[str, str]:
    """efa and slingshot: the aws-ofi-nccl plugin named (NCCL_NET, so NCCL fails rather than falling back to sockets)
    and its library; libfabric's provider (and on efa device RDMA) only for a declared plugin older than 1.7 or
    libfabric older than 1.18, else the minimums the node check holds each node to (FABRIC_MIN_VAR); on slingshot
    the provider's settings, LL128 off unless the declared NCCL is older than 2.27. {} for the other fabrics."""
    if net.fabric not in PROVIDERS:
        return {}
    env = {NCCL_NET_VAR: OFI_NET_NAME}
    if net.nccl_net_plugin:
        env[NCCL_NET_PLUGIN_VAR] = net.nccl_net_plugin
    if needs_fi_env(net.versions):
        env[FI_PROVIDER_VAR] = PROVIDERS[net.fabric]
        if net.fabric == "efa" and net.efa_device_rdma:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        env[FABRIC_MIN_VAR] = ""
    else:
        env[FABRIC_MIN_VAR] = format_minimums(NO_FI_ENV_FROM)
    if net.fabric == "slingshot":
        env.update(SLINGSHOT_ENV)
        nccl = declared(net.versions.nccl)
        if nccl is None or not older(nccl, SLINGSHOT_NO_LL128_FROM):
            env.update(NO_LL128)
    return env


def network_env(net: Network) -> dict[str, str]:
    """NCCL_* / GLOO_* variables for the profile's network, in a stable order."""
    env = {
        NCCL_SOCKET_IFNAME_VAR: net.nccl_socket_ifname,
        GLOO_SOCKET_IFNAME_VAR: net.gloo_socket_ifname,
    }
    if net.fabric in ("ethernet", "loopback"):
        env[NCCL_IB_DISABLE_VAR] = "1"
    if net.ib_hca:
        env[NCCL_IB_HCA_VAR] = ",".join(net.ib_hca)
    elif net.ib_hca_exclude:
        env[NCCL_IB_HCA_VAR] = "^" + ",".join(net.ib_hca_exclude)
    if net.roce_gid_index is not None:
        env[NCCL_IB_GID_INDEX_VAR] = str(net.roce_gid_index)
    if net.gdr_level is not None:
        env[NCCL_NET_GDR_LEVEL_VAR] = net.gdr_level
    env.update(libfabric_env(net))
    env.update(net.extra_env)
    return env
