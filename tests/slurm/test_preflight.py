"""Preflight on the real cluster's node namespaces: the network check and the bandwidth sweep."""

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_cli, run_seconds


def profile(tmp_path: Path, **network) -> Path:
    data = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())
    data["network"].update(network)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slurm
def test_preflight_on_two_namespaced_nodes(slurm, tmp_path):
    out = tmp_path / "out"
    r = run_cli("-m", "hpc.preflight", "--site", "local", "--nodes", "2", "--out", str(out), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"submitted preflight job (\d+)", r.stdout).group(1)
    elapsed = run_seconds(job)
    report = json.loads((out / f"preflight-{job}.json").read_text())
    nodes = [n["name"] for n in report["nodes"]]
    assert len(set(nodes)) == 2 and report["world_size"] == 4
    net = re.escape(slurm["NET"])
    for name in nodes:  # each node reports its own namespace's hostname and interface (nX has NET.1X)
        i = name.removeprefix("n")
        assert f"[health] {name} node: ok: 2 GPU(s) seen by nvidia-smi; the partition has 2" in r.stdout  # the fake's
        assert re.search(
            rf"^\[health\] {name} cpu: ok: fp32 matmul [\d.e-]+ TFLOP/s, memory copy [\d.e-]+ GB/s", r.stdout, re.M
        )
        assert re.search(
            rf"^{name} +{name} +lo 127\.0\.0\.1,::1; eth0 {net}\.1{i} .* gloo eth0 \({net}\.1{i}\)",
            r.stdout,
            re.M,
        )
    assert "all_reduce bus bandwidth, GB/s (gloo on cpu" in r.stdout and re.search(
        r"^ +16 MB( +\d+\.\d+){3}$", r.stdout, re.M
    )
    assert re.search(rf"^{nodes[0]}-{nodes[1]}( +\d+\.\d+){{3}}$", r.stdout, re.M)
    assert "the profile has no network.expected.inter_node_gbps: nothing to compare" in r.stdout
    assert r.stdout.rstrip().endswith("preflight passed")
    assert len(report["all"]) == 7 and all(row["busbw_gbps"] > 0 for row in report["all"])
    assert report["pairs"][0]["nodes"] == nodes and not report["analysis"]["failed"]
    assert (out / f"preflight-{job}.png").read_bytes()[:4] == b"\x89PNG"
    assert elapsed < 120, f"preflight took {elapsed:.0f} s"


@pytest.mark.slurm
@pytest.mark.parametrize(
    "key,value,message",
    [
        (
            "gloo_socket_ifname",
            "ib0",
            "GLOO_SOCKET_IFNAME=ib0 but this node has no interface ib0; it has lo (127.0.0.1, ::1), eth0 (NET.1",
        ),
        (
            "nccl_socket_ifname",
            "=eth1",
            "NCCL_SOCKET_IFNAME==eth1 but it selects no interface of this node; this node has lo (127.0.0.1, ::1), "
            "eth0 (NET.1",
        ),
    ],
)
def test_wrong_interface_fails_fast_naming_the_node(slurm, tmp_path, key, value, message):
    r = run_cli(
        "-m",
        "hpc.preflight",
        "--site",
        str(profile(tmp_path, **{key: value})),
        "--nodes",
        "2",
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    line = r.stderr.strip().splitlines()[-1]
    m = re.match(r"hpc\.preflight: error: job (\d+) FAILED: hpc\.node\.launch: error: n[1-4]: ", line)
    assert m, line
    assert message.replace("NET", slurm["NET"]) in line
    assert run_seconds(m.group(1)) < 60
    assert not (tmp_path / "out").exists()


@pytest.mark.slurm
def test_below_expected_bandwidth_exits_1(slurm, tmp_path):
    site = profile(tmp_path, expected={"intra_node_gbps": 0.001, "inter_node_gbps": 1000})
    r = run_cli(
        "-m",
        "hpc.preflight",
        "--site",
        str(site),
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--max-bytes",
        str(1 << 20),
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(
        r"inter-node busbw \(slowest of all ranks and node pairs\): [\d.e-]+ GB/s at 1 MB is below 0\.5 x the expected "
        r"1000 GB/s: FAIL",
        r.stdout,
    )
    assert "one rank per node: no intra-node bandwidth measured" in r.stdout
    assert "hpc.preflight: FAILED: bandwidth below 0.5 x the profile's expected" in r.stderr
    assert len(list((tmp_path / "out").glob("preflight-*.png"))) == 1
