"""hpc.jobs against other Slurm versions through the fake clients: slurmctld's records of Slurm 24.11 and 26.05 with
accounting off (sacct exits 1, 'Slurm accounting storage is disabled', as those clusters answered) or no sacct at
all; status names the cause and the next step, list falls back to squeue (tests/unit/data/slurm/versions)."""

import shutil

import pytest
from conftest import ROOT, run_cli
from slurm_fakes import FakeSlurm

VERSIONS = ROOT / "tests" / "unit" / "data" / "slurm" / "versions"


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_status_without_accounting_names_cause_and_next_step(tmp_path, version):
    slurm = FakeSlurm(tmp_path / "bin")
    slurm.answer("scontrol", (0, VERSIONS / version / "node_fail.scontrol"))
    slurm.answer("sacct", (1, VERSIONS / version / "node_fail.sacct"))
    r = run_cli("-m", "hpc.jobs", "status", "8", env=slurm.environ(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "job 8 (record slurm|outputs = x): NODE_FAIL" in r.stdout
    node = next(
        w for w in (VERSIONS / version / "node_fail.scontrol").read_text().split() if w.startswith("NodeList=")
    )[9:]
    assert "  cause: a node of the job failed (Slurm lost it)" in r.stdout
    assert f"  next: resubmit with --exclude {node} (and --preflight to check the nodes first); it resumes" in r.stdout


def test_list_without_sacct_lists_what_slurmctld_knows(tmp_path):
    slurm = FakeSlurm(tmp_path / "bin")
    (tmp_path / "bin" / "sacct").unlink()  # a site without sacct (no accounting client installed)
    rows = "".join((VERSIONS / "26.05" / f"{c}.squeue").read_text() for c in ("array_whole", "running"))
    slurm.answer("squeue", (0, rows))
    tools = tmp_path / "tools"  # what the fakes run, and no sacct (this machine has Slurm's own in /usr/bin)
    tools.mkdir()
    for tool in ("cat", "sed", "tail", "cp", "dirname", "basename"):
        (tools / tool).symlink_to(shutil.which(tool))
    env = {**slurm.environ(), "PATH": f"{tmp_path / 'bin'}:{tools}"}
    r = run_cli("-m", "hpc.jobs", "list", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "hpc.jobs: sacct is not on PATH" in r.stderr and "listing the jobs slurmctld knows" in r.stderr
    ids = [line.split()[0] for line in r.stdout.splitlines()[1:]]
    assert ids == ["3", "6_1", "6_[2-3%1]"]  # job by job, an array's running task before its pending range
