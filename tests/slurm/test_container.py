"""Containers that requeue, on the real local cluster: every rank runs inside a bubblewrap sandbox (the profile's
``command`` runtime) that hides Slurm's binaries, its config and munge's socket, so the rank cannot reach Slurm; the
stop record and the ``scontrol requeue`` happen outside. One job, submitted by ``hpc.submit`` with srun (one task per
GPU), is preempted, then requeued with ``scontrol requeue``, then by its time-limit notice, and resumes bitwise equal
to the uninterrupted baseline each time (the machinery of test_requeue.py).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, wait_job

from hpc.site import SHIPPED_SITE_DIR
from hpc.slurm_query import scontrol_fields
from slurm.requeue_checks import (
    STEPS,
    assert_completed,
    assert_same_as_baseline,
    batch_log,
    restarts,
    resumed_steps,
    steps_done,
    submit,
    time_limit_notice,
    wait_for,
    wait_resumed,
)

pytestmark = pytest.mark.slurm

SLURM_CLIENTS = ("scontrol", "srun", "sbatch", "squeue", "scancel", "sinfo", "sacct", "salloc")
PROBE = ROOT / "tests" / "scripts" / "sandbox_probe.py"
QUEUE_WAIT_S = 900  # the shared cluster may hold the job pending behind others first


def sandbox_profile(tmp_path: Path) -> Path:
    """The local profile with every rank inside bwrap: the host's files, minus Slurm (clients, config, munge)."""
    bwrap = shutil.which("bwrap")
    assert bwrap, "bubblewrap is not installed (scripts/install.sh installs it)"
    lab = Path(os.environ["SLURM_CONF"]).parent.parent  # the cluster's config, state, munge socket (and clients)
    hide = ["--tmpfs", str(lab), "--tmpfs", "/etc/slurm"]
    for name in SLURM_CLIENTS:  # the host's clients (a newer Slurm's stand in for them on the nodes)
        for path in {shutil.which(name), f"/usr/bin/{name}"}:
            if path and Path(path).exists() and not Path(path).is_relative_to(lab):
                hide += ["--ro-bind", "/dev/null", path]
    profile = yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text())
    profile["name"] = "local-sandbox"
    profile["container"] = {
        "runtime": "command",
        "python": sys.executable,
        "command": [
            bwrap,
            "--dev-bind",
            "/",
            "/",
            *hide,
            "--die-with-parent",
            "--chdir",
            "{workdir}",
            "--",
            sys.executable,
            str(PROBE),
        ],
    }
    path = tmp_path / "local-sandbox.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def assert_slurm_was_hidden(run: Path, restarts_seen: int) -> None:
    """Every rank of every run recorded, from inside its sandbox, that it could not reach Slurm."""
    records = [json.loads(p.read_text()) for p in sorted((run / "sandbox").glob("rank-*.json"))]
    assert sorted((r["restart"], r["rank"]) for r in records) == [
        (n, k) for n in range(restarts_seen + 1) for k in range(4)
    ]
    for r in records:
        assert r["scontrol_on_path"] is None, r
        assert r["scontrol_ping"].startswith("cannot run") and r["usr_bin_scontrol"].startswith("cannot run"), r
        assert not r["slurm_conf_readable"] and r["etc_slurm"] == [], r
    # ... while outside the sandbox the same client reaches the controller (the batch script's requeue uses it)
    assert subprocess.run(["scontrol", "ping"], capture_output=True, text=True).returncode == 0


def assert_clean_stops(log: str, n: int) -> None:
    """Each stop saved its own step inside the sandbox, and the next run resumed from exactly that step."""
    stops = [int(s) for s in re.findall(r"\[preempt\] stopped at step (\d+)", log)]
    assert len(stops) == n and stops == resumed_steps(log), (stops, resumed_steps(log))
    # every requeue the batch script decided came from a record hpc.node.launch wrote on the host for an exit 75 (after
    # scontrol requeue Slurm ends the step itself, and the launcher's line may be cut off with it)
    assert (
        log.count("stopped cleanly for a requeue")
        >= log.count("[job] stopped with a checkpoint saved; requeueing job")
        >= 1
    )


def test_preemption_scontrol_requeue_and_time_limit_reach_the_sandbox_and_requeue_outside(
    slurm, tmp_path, requeue_baseline
):
    t0 = time.time()
    site = str(sandbox_profile(tmp_path))
    job = submit(tmp_path, "ctr-requeue", "srun", "--partition", "low", site=site)
    run = tmp_path / "jobs" / "ctr-requeue"
    script = (run / f"{job}_submission.sh").read_text()
    assert "-m hpc.node.launch --launcher srun --container '" in script and "bwrap --dev-bind / /" in script

    # a job of the high partition wants exactly this job's nodes: it preempts this job (and no other)
    wait_for(lambda: steps_done(run) >= 12, timeout=QUEUE_WAIT_S, what="12 steps")
    high = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "high",
            "-N",
            "2",
            "-w",
            scontrol_fields(job)["NodeList"],
            "-o",
            str(tmp_path / "high-%j.log"),
            "--wrap",
            "sleep 2",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    wait_resumed(job, run, 1, timeout=QUEUE_WAIT_S)
    assert wait_job(high) == "COMPLETED"
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_resumed(job, run, 2, timeout=QUEUE_WAIT_S)
    time_limit_notice(job)
    assert_completed(job, run)
    n = restarts(job)
    print(f"\n[container] preemption, scontrol requeue, time-limit notice: {n} restarts, {time.time() - t0:.0f} s wall")
    log = batch_log(run, job)
    assert n >= 3 and "got SIGTERM" in log and log.count("got SIGUSR2") >= 2
    assert log.count("[job] stopped with a checkpoint saved; requeueing job") >= 1
    assert_clean_stops(log, n)
    assert_slurm_was_hidden(run, n)
    assert_same_as_baseline(run, requeue_baseline)

    # the finished run submitted again with fewer steps: done at once, never requeued
    again = submit(tmp_path, "ctr-requeue", "srun", site=site, trainer=(f"steps={STEPS - 20}",))
    assert_completed(again, run)
    assert restarts(again) == 0
    log = batch_log(run, again)
    assert f"the run is already at step {STEPS} of steps={STEPS - 20}: nothing to train" in log
    assert "[job] done" in log and "requeueing" not in log
