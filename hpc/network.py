"""A site's network settings as the environment variables NCCL and gloo read."""
from __future__ import annotations

from hpc.node.contract import (GLOO_SOCKET_IFNAME_VAR, NCCL_IB_DISABLE_VAR, NCCL_IB_GID_INDEX_VAR, NCCL_IB_HCA_VAR,
                               NCCL_NET_GDR_LEVEL_VAR, NCCL_SOCKET_IFNAME_VAR)
from hpc.site import Network


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
    env.update(net.extra_env)
    return env
