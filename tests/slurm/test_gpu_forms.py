"""Each way a partition asks for GPUs (tests/sites/local-forms.yaml), submitted to the local cluster: --gres=gpu:N
with --gres-flags, --gpus=TOTAL with --gpu-bind and --cpu-bind on the ranks' srun, and none (a CPU partition).
The rendered scripts are the goldens local-gres, local-gpus-bind and local-cpu."""

import json
import re

import pytest
from conftest import ROOT, job_nodes, run_cli, wait_job

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
