"""hpc.site init's reading of Slurm, over the outputs recorded from the local cluster (Slurm 22.05.8:
data/slurm/inventory/22.05; no 24.11 or 26.05 recording of these commands exists yet), and the profile it writes,
checked against the hand-written shipped profile of the same cluster (site_configs/local.yaml)."""

from pathlib import Path

import pytest
import yaml

from hpc import site_init
from hpc.node.tool import ToolResult
from hpc.shipped import SHIPPED_SITE_DIR
from hpc.site import SiteProfile
from hpc.slurm_inventory import InventoryError, gpus_of, parse_nodes, parse_partitions, read_cluster, slurm_version

REC = Path(__file__).parent / "data" / "slurm" / "inventory" / "22.05"
ETH_PROBE = {
    "host": "n1",
    "interfaces": [
        {"name": "lo", "addrs": ["127.0.0.1"], "up": True},
        {"name": "eth0", "addrs": ["10.250.0.11"], "up": True},
    ],
    "hcas": [],
}


def recorded(*overrides):
    """A fake `run` answering each client with the recorded output (or an override: argv tuple -> (rc, out, err))."""
    files = {
        ("scontrol", "--version"): "scontrol-version.out",
        ("scontrol", "show", "partition", "-o"): "show-partition.out",
        ("scontrol", "show", "node", "-o"): "show-node.out",
        ("sinfo", "-h", "-o", "%R|%a"): "sinfo.out",
    }
    special = dict(overrides)

    def run(argv, timeout_s):
        assert timeout_s
        if tuple(argv) in special:
            rc, out, err = special[tuple(argv)]
            return ToolResult(rc, out, err)
        return ToolResult(0, (REC / files[tuple(argv)]).read_text(), "")

    return run


def test_version_partitions_and_nodes_of_the_recorded_cluster():
    assert slurm_version((REC / "scontrol-version.out").read_text()) == "22.05.8"
    assert slurm_version("slurm 24.11.5\n") == "24.11.5"
    parts = {p.name: p for p in parse_partitions((REC / "show-partition.out").read_text())}
    assert {"debug", "low", "high"} <= set(parts) and parts["debug"].default and not parts["low"].default
    assert parts["debug"].nodes == ("n1", "n2", "n3", "n4") and parts["debug"].max_nodes is None
    assert parts["debug"].max_time == "02:00:00"
    n1 = parse_nodes((REC / "show-node.out").read_text())["n1"]
    assert (n1.cpus, n1.memory_mb, n1.gpus, n1.gpu_type, n1.features) == (2, 4000, 2, None, ())


@pytest.mark.parametrize(
    "gres, tres, found",
    [
        ("gpu:h100:8(S:0-1)", "cpu=192,mem=2000000M,billing=192,gres/gpu=8", (8, "h100")),
        ("gpu:a100:2,gpu:v100:2", "", (4, None)),
        ("gpu:4,nvme:1", "cpu=8", (4, None)),
        ("(null)", "cpu=2", (0, None)),
    ],
)
def test_gpus_from_gres_or_cfgtres(gres, tres, found):
    assert gpus_of(gres, tres) == found


def test_the_written_profile_matches_the_hand_written_one_of_the_same_cluster(tmp_path):
    cluster = read_cluster(recorded(), environ={})
    text = site_init.profile_text("mine", cluster, ETH_PROBE, "node n1", "/tmp/hpc-slurm/etc/slurm.conf")
    written = SiteProfile.model_validate(yaml.safe_load(text))
    shipped = SiteProfile.model_validate(yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text()))
    for ours in shipped.partitions:
        theirs = written.partition(ours.name)
        assert (theirs.max_nodes, theirs.gpus_per_node, theirs.cpus_per_node, theirs.max_time) == (
            ours.max_nodes,
            ours.gpus_per_node,
            ours.cpus_per_node,
            ours.max_time,
        )
    assert written.partition(None).name == "debug" and written.submission.slurm_conf == shipped.submission.slurm_conf
    assert (written.network.fabric, written.network.nccl_socket_ifname) == ("ethernet", "eth0")
    ib = {
        **ETH_PROBE,
        "hcas": [
            {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate": "400", "link_layer": "InfiniBand"},
            {"device": "mlx5_1", "port": 1, "state": "DOWN", "rate": "", "link_layer": "InfiniBand"},
        ],
    }
    net = SiteProfile.model_validate(yaml.safe_load(site_init.profile_text("m", cluster, ib, "n1", None))).network
    assert (net.fabric, net.ib_hca) == ("infiniband", ["mlx5_0"])


def test_slurm_that_cannot_be_asked_is_one_line():
    with pytest.raises(InventoryError) as e:
        read_cluster(recorded((("scontrol", "--version"), (1, "", "scontrol: error: cannot contact\n"))), environ={})
    assert str(e.value).startswith("scontrol --version failed: 'scontrol: error: cannot contact'")
    with pytest.raises(InventoryError, match="Slurm lists no partition"):
        read_cluster(recorded((("scontrol", "show", "partition", "-o"), (0, "", ""))), environ={})
    with pytest.raises(InventoryError, match="SLURM_CONF='/nonexistent' does not exist"):
        read_cluster(recorded(), environ={"SLURM_CONF": "/nonexistent"})


@pytest.mark.parametrize(
    "argv, line",
    [
        (["init", "bad/name"], "NAME 'bad/name': allowed are letters, digits"),
        (["init", "taken"], "taken.yaml exists: pass --force to replace it"),
        (["init", "x", "--output", "/nonexistent/x.yaml"], "folder /nonexistent does not exist"),
    ],
)
def test_bad_input_is_one_line_before_slurm_is_asked(argv, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.yaml").write_text("keep me\n")
    monkeypatch.setattr(site_init, "read_cluster", lambda: pytest.fail("Slurm was asked"))
    with pytest.raises(SystemExit) as e:
        site_init.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and line in err, err
    assert (tmp_path / "taken.yaml").read_text() == "keep me\n"
