"""hpc.submit --preflight on the local cluster: hpc.node.health runs on every node of the job before the ranks.

The nodes' nvidia-smi is the cluster's test fake (scripts/fake_nvidia_smi.sh), printing a recorded ``nvidia-smi -q`` of
the node's 2 GPUs: the faulty recording on the job's second node (SLURM_NODEID 1), or on the node that was the second
of the job's first run (the fault stays with the node), the healthy one elsewhere.
"""

import re

import pytest
import yaml
from conftest import ROOT, job_nodes, run_cli

from slurm.spare_checks import FAULTY_GPUS


def site_with_faulty_gpus(tmp_path, faulty: bool, sticky: bool = False, max_excluded: int = 0):
    bad = tmp_path / "bad-node"
    data = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())
    if faulty:
        data["environment"]["variables"][FAULTY_GPUS] = (
            f'[ -e {bad} ] || {{ [ "$SLURM_NODEID" = 1 ] && echo "$SLURMD_NODENAME" > {bad}; }}; '
            f'[ "$(cat {bad} 2>/dev/null)" = "$SLURMD_NODENAME" ]'
            if sticky
            else '[ "$SLURM_NODEID" = 1 ]'
        )
    data["preemption"] = {"max_excluded_nodes": max_excluded}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slurm
@pytest.mark.parametrize("faulty", [False, True])
def test_preflight_stops_the_job_on_a_faulty_node(slurm, tmp_path, faulty):
    site = site_with_faulty_gpus(tmp_path, faulty)
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
    assert f"[health] {first} node: ok: 2 GPU(s) seen by nvidia-smi; the partition has 2" in log, log
    assert f"[health] {first}: healthy" in log, log
    if not faulty:
        assert r.returncode == 0, r.stdout + r.stderr + log
        assert f"[health] {second}: healthy" in log and len(list((tmp_path / "ranks").glob("rank-*.json"))) == 4
        return
    assert r.returncode == 1, r.stdout + r.stderr + log
    assert f"[health] {second} gpu 1 (00000000:0F:00.0): FAIL: a row remapping is pending (needs a GPU reset)" in log
    assert f"[health] {second}: FAILED 3 check(s); exclude it with --exclude {second}" in log
    assert (
        f"[job] preflight: a node failed its health check, not training ({second} marked bad): not requeued (1 node(s) "
        "marked bad, at most 0 excluded; restart 0 of at most 5)"
    ) in log  # the profile allows no exclusion
    assert not (tmp_path / "ranks").exists()  # no rank started


@pytest.mark.slurm
def test_a_faulty_node_is_excluded_and_the_job_requeued_elsewhere(slurm, tmp_path):
    site = site_with_faulty_gpus(tmp_path, True, sticky=True, max_excluded=1)
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
    assert f"[health] {bad}: FAILED 3 check(s)" in log
    assert (
        f"[job] preflight: a node failed its health check, not training: {bad} marked bad; requeueing job {job} "
        f"excluding {bad}"
    ) in log
    assert f"[job] {job} on " in log and "(restart 1)" in log
    nodes = job_nodes(job)  # the restart's nodes
    assert bad not in nodes and len(nodes) == 2
    assert all(f"[health] {n}: healthy" in log.split("(restart 1)")[1] for n in nodes)
    assert len(list((tmp_path / "ranks").glob("rank-*.json"))) == 4
