"""A libfabric fabric's node checks (hpc/node/fabric.py) over fi_info outputs recorded from AWS's and HPE's
documentation and from this machine's libfabric (data/fi_info/README.md), and the NCCL net plugin's loading."""

from pathlib import Path

import pytest

from hpc.node.cli import NodeCheckError
from hpc.node.fabric import check_fabric, load_plugin, plugin_names, provider_domains

FI_INFO = Path(__file__).parent / "data" / "fi_info"


@pytest.mark.parametrize(
    "file,provider,domains",
    [
        ("efa-p4d.out", "efa", ["efa_0-rdm", "efa_1-rdm", "efa_2-rdm", "efa_3-rdm"]),
        ("cxi.out", "cxi", ["cxi0"]),
        ("cxi.out", "efa", []),
        ("efa-p4d.out", "cxi", []),
    ],
)
def test_domains_of_the_provider_itself(file, provider, domains):
    assert provider_domains((FI_INFO / file).read_text(), provider) == domains


def test_a_layered_provider_is_not_the_provider():
    """`tcp;ofi_rxm` runs over tcp; only the entries of plain `tcp` are tcp's own domains."""
    text = (FI_INFO / "tcp-layered.out").read_text()
    plain = [b.split("domain:")[1].split()[0] for b in text.split("provider: ")[1:] if b.startswith("tcp\n")]
    assert plain and provider_domains(text, "tcp") == list(dict.fromkeys(plain))
    assert provider_domains(text, "ofi_rxm") == [] and provider_domains(text, "tcp;ofi_rxm") != []


def test_plugin_names_follow_nccl():
    """NCCL dlopens NCCL_NET_PLUGIN as given, then libnccl-net-VALUE.so for a bare suffix; libnccl-net.so when unset
    (NVIDIA/nccl src/plugin/plugin_open.cc)."""
    assert plugin_names(None) == ["libnccl-net.so"]
    assert plugin_names("ofi") == ["ofi", "libnccl-net-ofi.so"]
    assert plugin_names("libnccl-net-ofi.so") == ["libnccl-net-ofi.so"]
    assert plugin_names("/opt/amazon/ofi-nccl/lib/libnccl-net.so") == ["/opt/amazon/ofi-nccl/lib/libnccl-net.so"]


def test_a_missing_or_foreign_plugin_is_named_in_one_line():
    with pytest.raises(NodeCheckError) as e:
        load_plugin("/nonexistent/libnccl-net-ofi.so")
    assert str(e.value).startswith(
        "NCCL_NET_PLUGIN=/nonexistent/libnccl-net-ofi.so, but the NCCL net plugin does not load "
        "on this node (/nonexistent/libnccl-net-ofi.so: cannot open shared object file"
    )
    with pytest.raises(NodeCheckError, match=r"libnccl-net-nosuch\.so: cannot open shared object file"):
        load_plugin("nosuch")
    with pytest.raises(NodeCheckError, match=r"libm\.so\.6 loads but is not an NCCL net plugin"):
        load_plugin("libm.so.6")  # a real library that NCCL would load and then find no plugin table in
    for text in (str(e.value),):
        assert "\n" not in text


def test_what_is_checked_follows_the_environment():
    assert (
        check_fabric({}) == []
        and check_fabric({"NCCL_NET": "Socket"}) == []
        and check_fabric({"NCCL_NET_PLUGIN": "none"}) == []
    )
    with pytest.raises(NodeCheckError, match="NCCL_NET names a plugin's net and NCCL_NET_PLUGIN is unset"):
        check_fabric({"NCCL_NET": "AWS Libfabric"})  # NCCL looks for libnccl-net.so, absent here
    assert check_fabric({"FI_PROVIDER": "^tcp"}) == []  # an exclusion names no provider to look for
