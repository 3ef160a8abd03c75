"""A site's network section (its keys, checked) and its settings as the environment variables NCCL and gloo read, each
with the profile key that sets it (`hpc.job_env` merges them with the profile's other variables: a variable has one
place)."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from hpc.node.cli import shown
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
from hpc.profile_base import Strict, nccl_list, shell_names


class Bandwidth(Strict):
    intra_node_gbps: Optional[float] = Field(
        None, gt=0, description="expected all_reduce bus bandwidth inside a node, GB/s"
    )
    inter_node_gbps: Optional[float] = Field(
        None, gt=0, description="expected all_reduce bus bandwidth across nodes, GB/s"
    )


VERSION_RE = r"^[0-9]+(\.[0-9]+){0,3}[A-Za-z0-9.+-]*$"  # 1.9.1, 1.18.2amzn1.0, 2.21.5-1


class FabricVersions(Strict):
    aws_ofi_nccl: Optional[str] = Field(None, pattern=VERSION_RE, max_length=100, description="the plugin, e.g. 1.9.1")
    libfabric: Optional[str] = Field(None, pattern=VERSION_RE, max_length=100, description="e.g. 1.21")
    nccl: Optional[str] = Field(None, pattern=VERSION_RE, max_length=100, description="e.g. 2.21.5")


class Network(Strict):
    fabric: Literal["infiniband", "roce", "ethernet", "loopback", "efa", "slingshot"]
    nccl_socket_ifname: str
    gloo_socket_ifname: str
    ib_hca: list[str] = Field(default_factory=list, description="HCAs NCCL may use, e.g. [mlx5_0, mlx5_1]")
    ib_hca_exclude: list[str] = Field(default_factory=list, description="HCAs NCCL must not use")
    roce_gid_index: Optional[int] = Field(None, ge=0)
    gdr_level: Optional[Literal["LOC", "PIX", "PXB", "PHB", "SYS"]] = None
    expected: Bandwidth = Bandwidth()
    extra_env: dict[str, str] = Field(default_factory=dict, description="more NCCL_*/UCX_* settings")
    nccl_net_plugin: Optional[str] = Field(
        None,
        pattern=r"^[^\s]+$",
        max_length=4096,
        description="efa, slingshot: "
        "NCCL_NET_PLUGIN, the aws-ofi-nccl library on the nodes: a path, a library name "
        "or the suffix of libnccl-net-SUFFIX.so (default: libnccl-net.so on the library path)",
    )
    efa_device_rdma: bool = Field(
        True,
        description="efa with a plugin older than 1.7 or libfabric older than 1.18 (network.versions): "
        "FI_EFA_USE_DEVICE_RDMA=1 (p4d, p5 and newer; false for p3dn)",
    )
    slingshot_set: Literal["cscs", "site"] = Field(
        "cscs",
        description="slingshot: the CXI and NCCL settings exported, CSCS's published set (docs/network.md) or "
        "the site's own whole set in extra_env (HPE's, Isambard-AI's), with none of the preset's",
    )
    versions: FabricVersions = Field(
        FabricVersions(),
        description="efa, slingshot: the aws-ofi-nccl, libfabric and NCCL versions the site runs; the preset sets "
        "what they need (unset: the current ones, checked on every node)",
    )

    @model_validator(mode="after")
    def _libfabric(self) -> "Network":
        if self.fabric in ("efa", "slingshot") and (
            self.ib_hca or self.ib_hca_exclude or self.roce_gid_index is not None
        ):
            raise ValueError(
                f"fabric {self.fabric} takes no ib_hca, ib_hca_exclude or roce_gid_index (NCCL reaches it "
                "through the libfabric plugin, not its IB transport)"
            )
        if self.fabric not in ("efa", "slingshot") and self.nccl_net_plugin is not None:
            raise ValueError(
                f"nccl_net_plugin is the libfabric plugin of fabric efa or slingshot, not of {self.fabric} "
                "(set NCCL_NET_PLUGIN in extra_env for another plugin)"
            )
        if self.fabric != "efa" and "efa_device_rdma" in self.model_fields_set:
            raise ValueError(f"efa_device_rdma is for fabric efa, not {self.fabric}")
        if self.fabric != "slingshot" and "slingshot_set" in self.model_fields_set:
            raise ValueError(f"slingshot_set is for fabric slingshot, not {self.fabric}")
        if self.fabric not in ("efa", "slingshot") and "versions" in self.model_fields_set:
            raise ValueError(f"versions are the libfabric plugin's of fabric efa or slingshot, not of {self.fabric}")
        return self

    @field_validator("extra_env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        shell_names(v, "extra_env")
        return v

    @field_validator("nccl_socket_ifname")
    @classmethod
    def _nccl_ifname(cls, v: str) -> str:
        nccl_list(v, NCCL_SOCKET_IFNAME_VAR)
        return v

    @field_validator("gloo_socket_ifname")
    @classmethod
    def _gloo_ifname(cls, v: str) -> str:
        if not all(re.fullmatch(r"[A-Za-z0-9_.-]+", n) for n in v.split(",")):
            raise ValueError(
                f"{shown(v)} is not a comma list of interface names (gloo takes exact names: no ^, = or ports)"
            )
        return v

    @field_validator("ib_hca", "ib_hca_exclude")
    @classmethod
    def _hcas(cls, v: list[str]) -> list[str]:
        if v:
            if any(item.startswith("^") for item in v):
                raise ValueError(
                    "an item starting with ^ is not an exclude list here: list the HCAs to avoid under ib_hca_exclude"
                )
            if any("," in item for item in v):
                raise ValueError("one HCA per item (a list, not a comma-separated string)")
            if any(item.startswith("=") for item in v[1:]):
                raise ValueError("= (exact names) applies to the whole list: put it on the first item only")
            nccl_list(",".join(v), NCCL_IB_HCA_VAR)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Network":
        if self.ib_hca and self.ib_hca_exclude:
            raise ValueError("give ib_hca or ib_hca_exclude, not both")
        if self.fabric in ("ethernet", "loopback") and (
            self.ib_hca or self.ib_hca_exclude or self.roce_gid_index is not None
        ):
            raise ValueError(f"fabric {self.fabric} takes no ib_hca, ib_hca_exclude or roce_gid_index")
        if self.fabric == "roce" and self.roce_gid_index is None:
            raise ValueError("fabric roce needs roce_gid_index (usually 3 for RoCE v2)")
        return self


# libfabric's provider of each fabric NCCL reaches through the aws-ofi-nccl plugin
PROVIDERS = {"efa": "efa", "slingshot": "cxi"}
EFA_RDMA_VAR = "FI_EFA_USE_DEVICE_RDMA"
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
NCCL_PROTO_VAR = "NCCL_PROTO"  # Slingshot, NCCL 2.27 and newer (LL128 on by default): CSCS turns LL128 off
NO_LL128 = "^LL128"
IB_VARS = (NCCL_IB_HCA_VAR, NCCL_IB_GID_INDEX_VAR, NCCL_IB_DISABLE_VAR)  # NCCL's IB transport, unused under libfabric

Settings = list[tuple[str, dict[str, Optional[str]]]]  # (where, {variable: value}); None: that key's, left unset


def declared(text: Optional[str]) -> Optional[tuple[int, ...]]:
    return parse_version(text) if text else None


def needs_fi_env(versions: FabricVersions) -> bool:
    """Whether the profile declares a plugin or libfabric older than those from which no FI_* variable is needed."""
    plugin, libfabric = declared(versions.aws_ofi_nccl), declared(versions.libfabric)
    return bool(
        plugin and older(plugin, NO_FI_ENV_FROM[PLUGIN]) or libfabric and older(libfabric, NO_FI_ENV_FROM[LIBFABRIC])
    )


def libfabric_settings(net: Network) -> Settings:
    """efa and slingshot: the aws-ofi-nccl plugin named (NCCL_NET, so NCCL fails rather than falling back to sockets)
    and its library; libfabric's provider (and on efa device RDMA) only for a declared plugin older than 1.7 or
    libfabric older than 1.18, else the minimums the node check holds each node to (FABRIC_MIN_VAR, empty for the
    older ones); on slingshot CSCS's set, LL128 off unless the declared NCCL is older than 2.27 (``slingshot_set:
    site``: none of it, the site's own set in extra_env). The fabric owns FI_PROVIDER, NCCL_PROTO (under CSCS's set)
    and NCCL's IB variables where it leaves them unset. [] for the other fabrics."""
    if net.fabric not in PROVIDERS:
        return []
    fabric, old = f"network.fabric {net.fabric}", needs_fi_env(net.versions)
    out: Settings = [
        (fabric, {NCCL_NET_VAR: OFI_NET_NAME}),
        ("network.nccl_net_plugin", {NCCL_NET_PLUGIN_VAR: net.nccl_net_plugin}),
        (
            fabric,
            {
                FI_PROVIDER_VAR: PROVIDERS[net.fabric] if old else None,
                **dict.fromkeys(IB_VARS),
            },
        ),
    ]
    if net.fabric == "efa":
        out.append(("network.efa_device_rdma", {EFA_RDMA_VAR: "1" if old and net.efa_device_rdma else None}))
    out.append((fabric, {FABRIC_MIN_VAR: "" if old else format_minimums(NO_FI_ENV_FROM)}))
    if net.fabric == "slingshot" and net.slingshot_set == "cscs":
        nccl = declared(net.versions.nccl)
        ll128_off = nccl is None or not older(nccl, SLINGSHOT_NO_LL128_FROM)
        out.append((fabric, {**SLINGSHOT_ENV, NCCL_PROTO_VAR: NO_LL128 if ll128_off else None}))
    return out


def network_settings(net: Network) -> Settings:
    """Each network key with the variables it sets, in the order they are exported; a key also owns the variables it
    leaves unset (None): ``nccl_net_plugin`` owns NCCL_NET_PLUGIN on efa and slingshot, ``gdr_level`` owns
    NCCL_NET_GDR_LEVEL, ``efa_device_rdma`` owns FI_EFA_USE_DEVICE_RDMA on efa, a libfabric fabric owns NCCL_NET,
    FI_PROVIDER, FABRIC_MIN_VAR, NCCL's IB variables and on slingshot NCCL_PROTO (`libfabric_settings`)."""
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
    out += libfabric_settings(net)
    out.append(("network.extra_env", dict(net.extra_env)))
    return out
