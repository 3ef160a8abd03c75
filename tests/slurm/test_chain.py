"""Chains and checks on the local cluster: --after (prepare -> train), --test-only, a dependency on no job."""

import re
import subprocess

import pytest
from conftest import run_cli, wait_job
from train_helpers import TINY

pytestmark = pytest.mark.slurm


def submit(tmp_path, name, *flags_and_args) -> str:
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--job-name",
        name,
        *flags_and_args,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    return re.search(r"submitted job (\d+)", r.stdout).group(1)


def times(job: str) -> tuple[str, str]:
    row = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "Start,End", "-j", job], capture_output=True, text=True
    ).stdout.split()[-1]
    start, end = row.split("|")
    return start, end


def test_train_starts_only_after_prepare_completed(slurm, tmp_path):
    # A held job in front of the chain: the preparation waits for it, so both chained jobs are surely pending when
    # checked, however idle the cluster is; releasing it lets the chain run.
    blocker = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-N1", "-J", "chain-blocker", "-o", "/dev/null", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    data = ("data.pack=documents", f"data.prepared={tmp_path / 'prepared'}")
    try:
        prep = submit(
            tmp_path, "chain-prepare", "--after", blocker, "--", "-m", "train.prepare", "--config", str(TINY), *data
        )
        train = submit(
            tmp_path,
            "chain-train",
            "--after",
            prep,
            "--",
            "--config",
            str(TINY),
            *data,
            "steps=5",
            "checkpoint.interval=0",
        )
        fields = subprocess.run(["scontrol", "show", "job", train], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["scontrol", "release", blocker], check=True)
    assert f"Dependency=afterok:{prep}" in fields and "JobState=PENDING" in fields and "Reason=Dependency" in fields
    assert wait_job(prep) == "COMPLETED"
    assert wait_job(train) == "COMPLETED"
    assert times(train)[0] >= times(prep)[1]  # ISO times: started once the preparation had ended
    assert (tmp_path / "prepared").is_dir()


def test_test_only_submits_nothing(slurm, tmp_path):
    name = f"chain-testonly-{tmp_path.name}"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        name,
        "--test-only",
        "--",
        "-m",
        "hpc.node.smoke",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    # Slurm's own line, as hpc.submit prints it (26.05 writes "at TIME a using")
    assert re.search(
        r"Job \d+ to start at \S+ (?:a )?using \d+ processors on nodes \S+ in partition debug", r.stdout
    ), r.stdout
    assert "nothing was submitted" in r.stdout
    assert subprocess.run(["squeue", "-h", "--name", name], capture_output=True, text=True).stdout == ""
    assert (
        subprocess.run(["sacct", "-X", "-n", "--name", name, "-S", "now-1hour"], capture_output=True, text=True).stdout
        == ""
    )
    assert list(tmp_path.iterdir()) == []


def test_a_dependency_on_no_job_is_refused(slurm, tmp_path):
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--job-name",
        "chain-nodep",
        "--after",
        "987654321:any",
        "--",
        "-m",
        "hpc.node.smoke",
        cwd=tmp_path,
    )
    assert r.returncode == 2
    assert (
        r.stderr == "hpc.submit: error: --after 987654321: no such job (neither squeue/scontrol nor sacct knows it)\n"
    )
    assert list(tmp_path.iterdir()) == []
