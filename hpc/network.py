"""A site's network settings as the environment variables NCCL and gloo read, each with the profile key that sets it
(`hpc.job_env` merges them with the profile's other variables: a variable has one place)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

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

if TYPE_CHECKING:
    from hpc.site import Network

# libfabric's provider of each fabric NCCL reaches through the aws-ofi-nccl plugin
PROVIDERS = {"efa": "efa", "slingshot": "cxi"}
EFA_RDMA_VAR = "FI_EFA_USE_DEVICE_RDMA"
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
IB_VARS = (NCCL_IB_HCA_VAR, NCCL_IB_GID_INDEX_VAR, NCCL_IB_DISABLE_VAR)  # NCCL's IB transport, unused under libfabric

Settings = list[tuple[str, dict[str, Optional[str]]]]  # (where, {variable: value}); None: that key's, left unset


def network_settings(net: Network) -> Settings:
    """Each network key with the variables it sets, in the order they are exported; a key also owns the variables it
    leaves unset (None): ``nccl_net_plugin`` owns NCCL_NET_PLUGIN on efa and slingshot, ``gdr_level`` owns
    NCCL_NET_GDR_LEVEL, a libfabric fabric owns NCCL_NET, FI_PROVIDER and NCCL's IB variables."""
    libfabric = net.fabric in PROVIDERS
    out: Settings = [
        ("network.nccl_socket_ifname", {NCCL_SOCKET_IFNAME_VAR: net.nccl_socket_ifname}),
        ("network.gloo_socket_ifname", {GLOO_SOCKET_IFNAME_VAR: net.gloo_socket_ifname}),
    ]
    if net.fabric in ("ethernet", "loopback"):
        out.append((f"network.fabric {net.fabric}", {NCCL_IB_DISABLE_VAR: "1"}))
    if not libfabric:
        hcas = (
            ",".join(net.ib_hca) if net.ib_hca else "^" + ",".join(net.ib_hca_exclude) if net.ib_hca_exclude else None
        )
        gid = str(net.roce_gid_index) if net.roce_gid_index is not None else None
        out += [("network.ib_hca", {NCCL_IB_HCA_VAR: hcas}), ("network.roce_gid_index", {NCCL_IB_GID_INDEX_VAR: gid})]
    out.append(("network.gdr_level", {NCCL_NET_GDR_LEVEL_VAR: net.gdr_level}))
    if libfabric:
        fabric = f"network.fabric {net.fabric}"
        out += [
            (fabric, {NCCL_NET_VAR: OFI_NET_NAME}),
            ("network.nccl_net_plugin", {NCCL_NET_PLUGIN_VAR: net.nccl_net_plugin}),
            (fabric, {FI_PROVIDER_VAR: PROVIDERS[net.fabric], **dict.fromkeys(IB_VARS)}),
        ]
        if net.fabric == "efa":
            out.append(("network.efa_device_rdma", {EFA_RDMA_VAR: "1" if net.efa_device_rdma else None}))
        if net.fabric == "slingshot":
            out.append((fabric, dict(SLINGSHOT_ENV)))
    out.append(("network.extra_env", dict(net.extra_env)))
    return out
