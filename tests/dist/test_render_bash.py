"""Rendered sbatch scripts under bash: every rendering parses, a hostile job name stays one word."""

import re
import shlex
import subprocess

import pytest
from login_helpers import HOSTILE, SITES, TEST_SITES, render

from hpc.node.ownership import run_dir_name


@pytest.mark.parametrize("site", SITES + TEST_SITES)
def test_bash_parses_every_rendering(site, monkeypatch, tmp_path):
    for kw in (
        {},
        {"launcher": "torchrun"},
        {"launcher": "accelerate"},
        {"job_name": HOSTILE},
        {"args": ["-m", "hpc.node.smoke", "--out", "/a b/$(x)"]},
    ):
        f = tmp_path / "job.sbatch"
        f.write_text(render(site, monkeypatch, **dict(kw)))
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_hostile_job_name_stays_one_quoted_word(monkeypatch):
    text = render("local", monkeypatch, job_name=HOSTILE)
    line = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --job-name="))
    assert shlex.split(line.removeprefix("#SBATCH --job-name=")) == [HOSTILE]
    # outside the quoted directive it appears only in a comment, one quoted export and as a directory name
    export = next(ln for ln in text.splitlines() if ln.startswith("export HPC_JOB_NAME="))
    r = subprocess.run(["bash", "-c", f'{export}; printf %s "$HPC_JOB_NAME"'], capture_output=True, text=True)
    assert r.stdout == HOSTILE
    executable = [ln for ln in text.splitlines() if ln and not ln.startswith("#") and ln != export]
    assert not any("touch /tmp" in ln or "$(id)" in ln for ln in executable)
    assert f"/jobs/{run_dir_name(HOSTILE)}/%j_0_log.out" in text
    assert run_dir_name(HOSTILE).startswith("x_touch_tmp_owned_id_id_q_HOME-")


# What the rendered script asks Slurm after a clean stop, and who then requeues the job: Slurm itself (exit 0: the batch
# script ends) or the script's own `scontrol requeue` (exit 1). Lines as Slurm prints them, cut to the fields read.
JOB = "JobId=7 JobName=run\n   Requeue=1 Restarts=0 BatchFlag={batch} Reboot=0 ExitCode=0:0\n   PreemptTime={preempt}\n"
CONFIG = "MaxBatchRequeue         = 5\nSLURM_VERSION           = {version}\n"
PARTITION = "PartitionName=low\n   PreemptMode={mode} State=UP TotalCPUs=8\n"
PREEMPTED = {"version": "24.11.5", "preempt": "2026-12-07T12:04:45", "mode": "REQUEUE", "batch": 1}


@pytest.mark.parametrize(
    "case, slurm_requeues",
    [
        ({}, True),
        ({"version": "24.05.1"}, True),
        ({"version": "26.05.5"}, True),
        ({"version": "23.11.10"}, False),  # these keep no mark after scontrol requeue: the script requeues
        ({"version": "22.05.8"}, False),
        ({"preempt": "None"}, False),  # a time-limit notice or scontrol requeue, not a preemption
        ({"mode": "CANCEL"}, False),  # Slurm would end the job, not requeue it
        ({"mode": "GANG,REQUEUE"}, True),
        ({"batch": 5}, False),  # one more of Slurm's requeues would pass MaxBatchRequeue: Slurm would hold the job
        ({"fail": True}, False),  # scontrol cannot reach Slurm
    ],
)
def test_who_requeues_a_stopped_job(case, slurm_requeues, monkeypatch, tmp_path):
    text = render("local", monkeypatch)
    function = re.search(r"^slurm_requeues_preempted\(\) \{\n.*?^\}\n", text, re.M | re.S).group(0)
    answers = {**PREEMPTED, **case}
    (tmp_path / "job").write_text(JOB.format(**answers))
    (tmp_path / "config").write_text(CONFIG.format(**answers))
    (tmp_path / "partition").write_text(PARTITION.format(**answers))
    fake = 'scontrol() { [ -z "$FAIL" ] || return 1; cat "$ANSWERS/$2"; }\n'
    r = subprocess.run(
        ["bash", "-c", f"set -eo pipefail\n{fake}{function}if slurm_requeues_preempted; then exit 0; fi; exit 1"],
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "ANSWERS": str(tmp_path),
            "FAIL": "1" if case.get("fail") else "",
            "SLURM_JOB_ID": "7",
            "SLURM_JOB_PARTITION": "low",
        },
    )
    assert (r.returncode == 0) == slurm_requeues, r.stderr
