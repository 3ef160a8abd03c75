"""Each way a partition asks for GPUs (tests/sites/local-forms.yaml), submitted to the local cluster: --gres=gpu:N
with --gres-flags, --gpus=TOTAL with --gpu-bind and --cpu-bind on the ranks' srun, and none (a CPU partition); and
--gres-flags=allow-task-sharing, refused or run as the cluster's Slurm version takes it.
The rendered scripts are the goldens local-gres, local-gpus-bind and local-cpu."""

import json
import re
import subprocess

import pytest
import yaml
from conftest import ROOT, job_nodes, run_cli, wait_job

from hpc.slurm_version import parse_version

pytestmark = pytest.mark.slurm
FORMS = ROOT / "tests" / "sites" / "local-forms.yaml"
# partition -> what each rank's CUDA_VISIBLE_DEVICES must be, from its local rank
VISIBLE = {"debug": lambda local: "0,1", "low": lambda local: str(local), "cpu": lambda local: None}
NODES = {"debug": 1, "low": 2, "cpu": 1}  # --gpus is the job's total: two nodes share it


def test_every_gpu_request_form_runs_its_ranks(slurm, tmp_path):
    jobs = {}
    for part in VISIBLE:  # submitted together: the three jobs run side by side
        r = run_cli(
            "-m",
            "hpc.submit",
            "--site",
            str(FORMS),
            "--partition",
            part,
            "--nodes",
            str(NODES[part]),
            "--job-name",
            f"forms-{part}",
            "--",
            "-m",
            "hpc.node.smoke",
            "--out",
            str(tmp_path / part),
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        jobs[part] = re.search(r"submitted job (\d+)", r.stdout).group(1)
    for part, job in jobs.items():
        assert wait_job(job) == "COMPLETED", part
        recs = [json.loads(p.read_text()) for p in sorted((tmp_path / part).glob("rank-*.json"))]
        world = 2 * NODES[part]
        assert sorted(int(r["rank"]) for r in recs) == list(range(world))
        assert all(
            r["allreduce"] == r["expected"] == world * (world + 1) / 2 and r["master_addr"] == job_nodes(job)[0]
            for r in recs
        )
        assert {r["slurmd_nodename"] for r in recs} == set(job_nodes(job))
        assert [r["cuda_visible_devices"] for r in recs] == [VISIBLE[part](int(r["local_rank"])) for r in recs], part


def test_allow_task_sharing_runs_where_the_clusters_slurm_takes_it(slurm, tmp_path):
    """--gres-flags=allow-task-sharing (srun only) came in Slurm 23.11: older clusters refuse it at submit in one line,
    newer ones run the bound ranks with it."""
    version = parse_version(subprocess.run(["sbatch", "--version"], capture_output=True, text=True).stdout)
    profile = yaml.safe_load(FORMS.read_text())
    low = next(p for p in profile["partitions"] if p["name"] == "low")
    low["gres_flags"] = ["allow-task-sharing"]
    site = tmp_path / "sharing.yaml"
    site.write_text(yaml.safe_dump(profile))
    out = tmp_path / "ranks"
    r = run_cli(
        *("-m", "hpc.submit", "--site", str(site), "--partition", "low", "--nodes", "2", "--job-name", "sharing"),
        *("--", "-m", "hpc.node.smoke", "--out", str(out)),
        cwd=tmp_path,
    )
    if version < (23, 11):
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "partitions[low].gres_flags: allow-task-sharing needs Slurm 23.11 or newer" in r.stderr
        assert not (tmp_path / "jobs").exists()
        return
    assert r.returncode == 0, r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    script = (tmp_path / "jobs" / "sharing" / f"{job}_submission.sh").read_text()
    assert "--gpu-bind=map_gpu:0,1 --gres-flags=allow-task-sharing" in script
    assert wait_job(job) == "COMPLETED"
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert sorted(int(r["rank"]) for r in recs) == [0, 1, 2, 3]
    assert [r["cuda_visible_devices"] for r in recs] == [VISIBLE["low"](int(r["local_rank"])) for r in recs]


def test_gpus_form_with_a_spare(slurm, tmp_path):
    """--gpus with a spare node: the job asks for both nodes' GPUs (--gpus=4), the ranks' step on one node for its
    own (--gpus=2, through hpc.node.restart); each rank sees its GPU (the golden local-gpus-spares)."""
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        str(FORMS),
        "--partition",
        "low",
        "--nodes",
        "1",
        "--spare-nodes",
        "1",
        "--job-name",
        "forms-spare",
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(tmp_path / "spare"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    assert wait_job(job) == "COMPLETED"
    assert len(job_nodes(job)) == 2
    recs = [json.loads(p.read_text()) for p in sorted((tmp_path / "spare").glob("rank-*.json"))]
    assert sorted(int(r["rank"]) for r in recs) == [0, 1]
    assert [r["cuda_visible_devices"] for r in recs] == [str(int(r["local_rank"])) for r in recs]
