"""The fabric presets by version (aws-ofi-nccl's documentation: no FI_* variable from plugin 1.7 on libfabric 1.18;
p5 needs NCCL 2.18.5 and plugin 1.7.3; CSCS turns LL128 off on Slingshot from NCCL 2.27) and the node check that
holds every node to the minimums they rely on, over fi_info outputs from public documentation
(data/fi_info/README.md) and plugin libraries made here."""

from pathlib import Path

import pytest
import yaml

from hpc.job_env import merge
from hpc.network import network_settings
from hpc.node.cli import NodeCheckError
from hpc.node.contract import FABRIC_MIN_VAR
from hpc.node.fabric import check_fabric
from hpc.node.fabric_versions import (
    Found,
    check_versions,
    libfabric_version,
    library_path,
    parse_version,
    plugin_version,
)
from hpc.node.tool import ToolResult
from hpc.shipped import SHIPPED_SITE_DIR
from hpc.site import SiteError, load_site

FI_INFO = Path(__file__).parent / "data" / "fi_info"


def answer(file: str, rc: int = 0):
    def run(argv, timeout_s):
        assert argv == ["fi_info", "--version"]
        return ToolResult(rc, (FI_INFO / file).read_text(), "")

    return run


@pytest.mark.parametrize(
    "text, version",
    [("1.22.0amzn5.0", (1, 22, 0)), ("1.9.1-aws", (1, 9, 1)), ("2.21.5", (2, 21, 5)), ("1.18", (1, 18)), ("x1", None)],
)
def test_versions_are_their_leading_numbers(text, version):
    assert parse_version(text) == version


def test_libfabric_version_from_fi_info():
    assert libfabric_version(answer("version-efa.out")) == (1, 22, 0)
    assert libfabric_version(answer("version-source.out")) == (1, 21, 0)
    assert libfabric_version(answer("missing.err", rc=1)) is None


def test_plugin_version_from_the_library_it_is_loaded_from(tmp_path):
    lib = tmp_path / "libnccl-net-ofi.so"
    lib.write_bytes(b"\x7fELF\0\0junk\0Initializing aws-ofi-nccl 1.6.0-aws\0more")
    assert plugin_version(str(lib)) == (1, 6, 0)
    (tmp_path / "libother.so").write_bytes(b"\x7fELF\0nothing here")
    assert plugin_version(str(tmp_path / "libother.so")) is None and plugin_version(str(tmp_path / "absent")) is None
    assert library_path("libnccl-net-ofi.so", {"LD_LIBRARY_PATH": f"/nonexistent:{tmp_path}"}) == str(lib)


MIN = {FABRIC_MIN_VAR: "aws-ofi-nccl=1.7,libfabric=1.18"}


def test_a_node_older_than_the_minimums_is_named_in_one_line():
    with pytest.raises(NodeCheckError) as e:
        check_versions(MIN, Found(plugin=(1, 6, 0), libfabric=(1, 22, 0), nccl=(2, 21, 5)))
    assert str(e.value).startswith("aws-ofi-nccl 1.6.0 is older than 1.7 on this node:") and "\n" not in str(e.value)
    with pytest.raises(NodeCheckError) as e:
        check_versions(MIN, Found(plugin=(1, 7, 2), libfabric=(1, 17, 0), nccl=(2, 18, 3), p5=True))
    assert str(e.value).startswith(
        "aws-ofi-nccl 1.7.2 is older than 1.7.3; libfabric 1.17.0 is older than 1.18; nccl 2.18.3 is older than 2.18.5"
    ), e.value
    ok = check_versions(MIN, Found(plugin=(1, 9, 1), libfabric=None, nccl=(2, 21, 5), p5=True))
    assert ok == "versions aws-ofi-nccl 1.9.1, libfabric unknown, nccl 2.21.5"
    assert check_versions({FABRIC_MIN_VAR: ""}, Found((1, 5, 0), (1, 16, 0), (2, 10, 3))).startswith("versions")


def test_check_fabric_checks_versions_only_for_a_libfabric_job():
    seen = []

    def versions(environ, plugin, run):
        seen.append(plugin)
        return Found((1, 5, 0), (1, 22, 0), None)

    with pytest.raises(NodeCheckError, match="aws-ofi-nccl 1.5.0 is older than 1.7"):
        check_fabric(MIN, versions=versions)
    assert check_fabric({}, versions=versions) == [] and seen == [None]


def profile(tmp_path, name: str, **network) -> Path:
    data = yaml.safe_load((SHIPPED_SITE_DIR / f"{name}.yaml").read_text())
    data["network"].update(network)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "p.yaml"


def env_of(path: Path) -> dict[str, str]:
    return merge(network_settings(load_site(str(path)).network))


def test_efa_preset_sets_fi_variables_only_for_versions_that_need_them(tmp_path):
    current = env_of(SHIPPED_SITE_DIR / "aws-p5-efa.yaml")
    assert (
        not [k for k in current if k.startswith("FI_")] and current[FABRIC_MIN_VAR] == "aws-ofi-nccl=1.7,libfabric=1.18"
    )
    old = env_of(profile(tmp_path, "aws-p5-efa", versions={"aws_ofi_nccl": "1.5.0", "libfabric": "1.16.0"}))
    assert old["FI_PROVIDER"] == "efa" and old["FI_EFA_USE_DEVICE_RDMA"] == "1" and old[FABRIC_MIN_VAR] == ""
    p3dn = env_of(profile(tmp_path, "aws-p5-efa", versions={"libfabric": "1.17.1"}, efa_device_rdma=False))
    assert p3dn["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in p3dn


def test_slingshot_preset_is_cscs_set_with_ll128_off_from_nccl_2_27(tmp_path):
    shipped = env_of(SHIPPED_SITE_DIR / "slingshot-gh200.yaml")
    assert shipped["FI_CXI_DEFAULT_TX_SIZE"] == "32768" and shipped["FI_CXI_RX_MATCH_MODE"] == "software"
    assert shipped["NCCL_PROTO"] == "^LL128" and "FI_PROVIDER" not in shipped
    assert "NCCL_PROTO" not in env_of(profile(tmp_path, "slingshot-gh200", versions={"nccl": "2.26.6"}))
    assert env_of(profile(tmp_path, "slingshot-gh200", versions={"nccl": "2.27.3"}))["NCCL_PROTO"] == "^LL128"
    assert env_of(profile(tmp_path, "slingshot-gh200", versions={"aws_ofi_nccl": "1.6.0"}))["FI_PROVIDER"] == "cxi"


def test_a_slingshot_site_on_its_own_set_exports_it_and_none_of_cscs(tmp_path):
    hpe = {"FI_CXI_DEFAULT_TX_SIZE": "2048", "FI_CXI_RX_MATCH_MODE": "hybrid", "FI_CXI_RDZV_PROTO": "alt_read"}
    with pytest.raises(SiteError) as e:  # the preset owns its values: changing one alone is refused
        load_site(str(profile(tmp_path, "slingshot-gh200", extra_env=hpe)))
    assert "FI_CXI_DEFAULT_TX_SIZE" in str(e.value) and "\n" not in str(e.value), e.value
    env = env_of(profile(tmp_path, "slingshot-gh200", slingshot_set="site", extra_env=hpe))
    assert {k: env[k] for k in hpe} == hpe
    assert not {"FI_CXI_DEFAULT_CQ_SIZE", "FI_MR_CACHE_MONITOR", "NCCL_PROTO", "NCCL_CROSS_NIC"} & env.keys()
    assert env["NCCL_NET"] and FABRIC_MIN_VAR in env  # the fabric's own settings stay


@pytest.mark.parametrize(
    "name, network, message",
    [
        ("local", {"versions": {"nccl": "2.21.5"}}, "network: versions are the libfabric plugin's of fabric efa"),
        ("aws-p5-efa", {"versions": {"nccl": "two"}}, "network.versions.nccl: String should match pattern"),
        ("aws-p5-efa", {"versions": {"ncl": "2.21.5"}}, "network.versions.ncl: unknown key"),
        ("aws-p5-efa", {"slingshot_set": "site"}, "network: slingshot_set is for fabric slingshot, not efa"),
        ("slingshot-gh200", {"slingshot_set": "hpe"}, "network.slingshot_set: Input should be 'cscs' or 'site'"),
    ],
)
def test_bad_versions_are_one_line(tmp_path, name, network, message):
    with pytest.raises(SiteError) as e:
        load_site(str(profile(tmp_path, name, **network)))
    assert message in str(e.value) and "\n" not in str(e.value), e.value
