"""hpc.submit --preflight on the local cluster: hpc.node.health runs on every node of the job before the ranks.

The nodes have no NVIDIA driver; a stand-in ``nvidia-smi`` on the job's PATH (the profile's environment.setup) prints a
recorded ``nvidia-smi -q``: the faulty recording on the job's second node (SLURM_NODEID 1), or on the node that was the
second of the job's first run (the fault stays with the node), the healthy one elsewhere.
"""

import re

import pytest
import yaml
from conftest import ROOT, job_nodes, run_cli

SMI = ROOT / "tests" / "unit" / "data" / "nvidia-smi"


def site_with_smi(tmp_path, second_node: str, sticky: bool = False, max_excluded: int = 0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    bad = tmp_path / "bad-node"
    faulty = (
        f'[ -e {bad} ] || {{ [ "$SLURM_NODEID" = 1 ] && echo "$SLURMD_NODENAME" > {bad}; }}; '
        f'[ "$(cat {bad} 2>/dev/null)" = "$SLURMD_NODENAME" ]'
        if sticky
        else '[ "$SLURM_NODEID" = 1 ]'
    )
    fake.write_text(
        f"#!/bin/bash\nif {faulty}; then cat {SMI / second_node}; else cat {SMI / 'h100-healthy.txt'}; fi\n"
    )
    fake.chmod(0o755)
    data = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())
    data["environment"]["setup"] = f'export PATH={bin_dir}:"$PATH"'
    data["preemption"] = {"max_excluded_nodes": max_excluded}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slurm
@pytest.mark.parametrize("second_node", ["h100-healthy.txt", "h100-faulty.txt"])
def test_preflight_stops_the_job_on_a_faulty_node(slurm, tmp_path, second_node):
    site = site_with_smi(tmp_path, second_node)
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        str(site),
        "--nodes",
        "2",
        "--preflight",
        "--time",
        "5",
        "--wait",
        "--job-name",
        f"health-{tmp_path.name}",
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(tmp_path / "ranks"),
        cwd=tmp_path,
        timeout=300,
    )
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    log = next((tmp_path / "jobs").glob(f"*/{job}_0_log.out")).read_text()
    first, second = job_nodes(job)
    assert f"[health] {first}: healthy" in log, log
    if second_node == "h100-healthy.txt":
        assert r.returncode == 0, r.stdout + r.stderr + log
        assert f"[health] {second}: healthy" in log and len(list((tmp_path / "ranks").glob("rank-*.json"))) == 4
        return
    assert r.returncode == 1, r.stdout + r.stderr + log
    assert f"[health] {second} gpu 5 (00000000:AB:00.0): FAIL: a row remapping is pending (needs a GPU reset)" in log
    assert f"[health] {second}: FAILED 5 check(s); exclude it with --exclude {second}" in log
    assert (
        f"[job] preflight: a node failed its health check, not training ({second} marked bad): not requeued (1 node(s) "
        "marked bad, at most 0 excluded; restart 0 of at most 5)"
    ) in log  # the profile allows no exclusion
    assert not (tmp_path / "ranks").exists()  # no rank started


@pytest.mark.slurm
def test_a_faulty_node_is_excluded_and_the_job_requeued_elsewhere(slurm, tmp_path):
    site = site_with_smi(tmp_path, "h100-faulty.txt", sticky=True, max_excluded=1)
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        str(site),
        "--nodes",
        "2",
        "--preflight",
        "--time",
        "5",
        "--wait",
        "--job-name",
        f"exclude-{tmp_path.name}",
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(tmp_path / "ranks"),
        cwd=tmp_path,
        timeout=400,
    )
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    log = next((tmp_path / "jobs").glob(f"*/{job}_0_log.out")).read_text()
    assert r.returncode == 0, r.stdout + r.stderr + log
    bad = (tmp_path / "bad-node").read_text().strip()
    assert f"[health] {bad}: FAILED 5 check(s)" in log
    assert (
        f"[job] preflight: a node failed its health check, not training: {bad} marked bad; requeueing job {job} "
        f"excluding {bad}"
    ) in log
    assert f"[job] {job} on " in log and "(restart 1)" in log
    nodes = job_nodes(job)  # the restart's nodes
    assert bad not in nodes and len(nodes) == 2
    assert all(f"[health] {n}: healthy" in log.split("(restart 1)")[1] for n in nodes)
    assert len(list((tmp_path / "ranks").glob("rank-*.json"))) == 4
