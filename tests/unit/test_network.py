"""Node network checks: NCCL/gloo interface and HCA selection, on this machine's real interfaces,
through hpc.node.launch, and the bounded rendezvous timeout on the real cluster."""

from pathlib import Path

import pytest

from hpc.node.cli import NodeCheckError
from hpc.node.netcheck import (
    DEFAULT_DIST_TIMEOUT_S,
    HcaPort,
    Interface,
    NcclList,
    check_gloo_ifname,
    check_ib_hca,
    check_nccl_ifname,
    check_node,
    dist_timeout_s,
    hca_ports,
    interfaces,
)

NODE = [
    Interface("lo", ("127.0.0.1",), True),
    Interface("eth0", ("10.0.0.5",), True),
    Interface("eth1", ("10.1.0.5",), True),
    Interface("docker0", ("172.17.0.1",), True),
    Interface("ib0", (), True),
    Interface("eth2", ("10.2.0.5",), False),
]


def names(ifaces):
    return [i.name for i in ifaces]


def test_real_interfaces_include_loopback():
    lo = next(i for i in interfaces() if i.name == "lo")
    assert lo.up and "127.0.0.1" in lo.addrs


def test_gloo_wrong_name_on_this_machine_names_what_it_has():
    ifaces = interfaces()
    assert names(check_gloo_ifname("lo", ifaces)) == ["lo"]
    with pytest.raises(NodeCheckError) as e:
        check_gloo_ifname("nosuch9", ifaces)
    msg = str(e.value)
    assert msg.startswith("GLOO_SOCKET_IFNAME=nosuch9 but this node has no interface nosuch9; it has ")
    assert "lo (127.0.0.1" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "value,chosen",
    [
        ("eth", ["eth0", "eth1"]),  # prefix; eth2 is down
        ("=eth0", ["eth0"]),
        ("eth1,docker", ["eth1", "docker0"]),
        ("^lo,docker", ["eth0", "eth1"]),
        ("^=eth0", ["lo", "eth1", "docker0"]),
    ],
)
def test_nccl_socket_ifname_forms(value, chosen):
    assert names(check_nccl_ifname(value, NODE)) == chosen


@pytest.mark.parametrize(
    "value,message",
    [
        (
            "=eth",
            "NCCL_SOCKET_IFNAME==eth but it selects no interface of this node; this node has lo (127.0.0.1), eth0 "
            "(10.0.0.5)",
        ),
        ("ib", "NCCL_SOCKET_IFNAME=ib but it selects only ib0 (no address), none up with an address"),
        ("=eth2", "eth2 (10.2.0.5, down), none up with an address"),
        ("eth0:x", "NCCL_SOCKET_IFNAME='eth0:x' is not an NCCL list"),
    ],
)
def test_nccl_socket_ifname_errors(value, message):
    with pytest.raises(NodeCheckError) as e:
        check_nccl_ifname(value, NODE)
    assert message in str(e.value)


def test_gloo_list_needs_every_name_usable():
    assert names(check_gloo_ifname("eth0,eth1", NODE)) == ["eth0", "eth1"]
    with pytest.raises(NodeCheckError, match="interface ib0 \\(no address\\) is not up with an address"):
        check_gloo_ifname("eth0,ib0", NODE)
    with pytest.raises(NodeCheckError, match="no interface eth"):
        check_gloo_ifname("eth", NODE)  # gloo takes exact names, no prefixes


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """An /sys/class/infiniband layout: mlx5_0 port 1 active, mlx5_1 port 1 down."""
    for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        port = tmp_path / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    return tmp_path


def test_hca_ports_from_sysfs(sysfs):
    assert hca_ports(sysfs) == [
        HcaPort("mlx5_0", 1, "ACTIVE", "400 Gb/sec (4X NDR)"),
        HcaPort("mlx5_1", 1, "DOWN", "400 Gb/sec (4X NDR)"),
    ]
    assert hca_ports(sysfs / "absent") == []


@pytest.mark.parametrize(
    "value,ok",
    [
        ("mlx5_0", True),
        ("=mlx5_0:1", True),
        ("mlx5", True),
        ("^=mlx5_1", True),
        ("mlx5_0:2", False),
        ("mlx5_1", False),
        ("mlx5_9", False),
        ("^mlx5_0", False),
        ("mlx5_0,mlx5_1", False),
    ],
)
def test_ib_hca_forms(sysfs, value, ok):
    ports = hca_ports(sysfs)
    if ok:
        assert all(p.state == "ACTIVE" for p in check_ib_hca(value, ports))
    else:
        with pytest.raises(NodeCheckError) as e:
            check_ib_hca(value, ports)
        assert str(e.value).startswith(f"NCCL_IB_HCA={value} ") and "mlx5_0:1 ACTIVE, mlx5_1:1 DOWN" in str(e.value)


def test_check_node_reads_the_environment(sysfs):
    env = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "^lo,docker", "NCCL_IB_HCA": "mlx5_9"}
    with pytest.raises(NodeCheckError, match="no HCA mlx5_9"):
        check_node(env, NODE, hca_ports(sysfs))
    summary = check_node({**env, "NCCL_IB_DISABLE": "1"}, NODE, hca_ports(sysfs))  # sockets only: HCAs unused
    assert summary == "gloo eth0 (10.0.0.5); nccl socket eth0 (10.0.0.5), eth1 (10.1.0.5)"
    assert "nothing to check" in check_node({}, NODE, [])


def test_dist_timeout():
    assert dist_timeout_s({}) == DEFAULT_DIST_TIMEOUT_S
    assert dist_timeout_s({"HPC_DIST_TIMEOUT_S": "7.5"}) == 7.5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(NodeCheckError, match="HPC_DIST_TIMEOUT_S"):
            dist_timeout_s({"HPC_DIST_TIMEOUT_S": bad})


def test_nccl_lists_read_caret_and_equals_once_for_the_whole_list():
    """As NCCL reads them: `=mlx5_0,mlx5_1` is exact for both names, so it never prefix-matches mlx5_10."""
    exact = NcclList.parse("=mlx5_0,mlx5_1", "NCCL_IB_HCA")
    assert exact.listed("mlx5_1") and not exact.listed("mlx5_10") and not exact.listed("mlx5_01")
    prefix = NcclList.parse("mlx5_1", "NCCL_IB_HCA")
    assert prefix.listed("mlx5_10")
    both = NcclList.parse("^=eth0", "NCCL_SOCKET_IFNAME")
    assert both.selects("eth01") and not both.selects("eth0")
    for bad in ("mlx5_0,^mlx5_1", "mlx5_0,=mlx5_1", "=^eth0", "eth0;rm", "a,,b", "mlx5_0:x"):
        with pytest.raises(NodeCheckError, match="is not an NCCL list"):
            NcclList.parse(bad, "NCCL_IB_HCA")
