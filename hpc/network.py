"""A site's network settings as the environment variables NCCL and gloo read."""

from __future__ import annotations

from hpc.node.contract import (
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
from hpc.site import Network

# libfabric's provider of each fabric NCCL reaches through the aws-ofi-nccl plugin
PROVIDERS = {"efa": "efa", "slingshot": "cxi"}
# HPE Slingshot (CXI) settings for NCCL, as CSCS documents them for Alps: larger completion and transmit queues,
# software tag matching, no host registration, the userfaultfd memory-registration cache monitor, any NIC for a ring
SLINGSHOT_ENV = {
    "NCCL_CROSS_NIC": "1",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "FI_CXI_DEFAULT_TX_SIZE": "32768",
    "FI_CXI_DISABLE_HOST_REGISTER": "1",
    "FI_CXI_RX_MATCH_MODE": "software",
    "FI_MR_CACHE_MONITOR": "userfaultfd",
}


def libfabric_env(net: Network) -> dict[str, str]:
    """efa and slingshot: the aws-ofi-nccl plugin named (NCCL_NET, so NCCL fails rather than falling back to sockets),
    its library, libfabric's provider and the provider's settings; {} for the other fabrics."""
    if net.fabric not in PROVIDERS:
        return {}
    env = {NCCL_NET_VAR: OFI_NET_NAME}
    if net.nccl_net_plugin:
        env[NCCL_NET_PLUGIN_VAR] = net.nccl_net_plugin
    env[FI_PROVIDER_VAR] = PROVIDERS[net.fabric]
    if net.fabric == "efa" and net.efa_device_rdma:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    if net.fabric == "slingshot":
        env.update(SLINGSHOT_ENV)
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
