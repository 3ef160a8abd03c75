"""A rank missing at a hang on the real local cluster: the job (2 nodes, dp2 x tp2) is requeued without its node and
the restart, on two other nodes, resumes from the last checkpoint and ends equal to the uninterrupted baseline.

Rank 2 (the second node's first rank) stops itself (SIGSTOP, the test-only straggler.test_stop_rank) after step 12,
in the first run only (a resumed run does not stop); the other ranks time out after HPC_DIST_TIMEOUT_S, rank 0 names
rank 2 and its node and marks the node bad, and the batch script requeues the job excluding it.
"""

import re
import subprocess
import time

import pytest
from conftest import job_nodes

from hpc.slurm_query import scontrol_fields
from slurm.requeue_checks import (
    assert_completed,
    assert_same_as_baseline,
    batch_log,
    restarts,
    resumed_steps,
    submit,
    wait_for,
)

pytestmark = pytest.mark.slurm

TIMEOUT_S = 15


def test_a_rank_missing_at_a_hang_has_its_node_excluded(slurm, tmp_path, requeue_baseline, monkeypatch):
    monkeypatch.setenv("HPC_DIST_TIMEOUT_S", str(TIMEOUT_S))  # sbatch passes the submitter's environment on
    t0 = time.monotonic()
    job = submit(tmp_path, "hang", trainer=("straggler.test_stop_rank=2", "straggler.test_stop_step=12"))
    run = tmp_path / "jobs" / "hang"
    rank2 = run / f"{job}_2_log.out"
    wait_for(lambda: rank2.exists() and "stopping myself" in rank2.read_text(), timeout=600, what="the stop of rank 2")
    t_stop = time.monotonic()
    first = job_nodes(job)
    wait_for(lambda: "did not arrive" in batch_log(run, job), timeout=TIMEOUT_S + 60, what="the [hang] line")
    t_named = time.monotonic()
    wait_for(lambda: restarts(job) >= 1, timeout=TIMEOUT_S + 120, what="the requeue")
    t_requeued = time.monotonic()
    subprocess.run(
        ["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True
    )  # skip the requeue delay
    assert_completed(job, run, timeout=900)
    log = batch_log(run, job)
    bad = first[1]
    assert re.search(
        rf"\[hang\] a collective timed out after step 12 \(after \d+ s\): rank 2 on {bad} did not arrive "
        r"\(ranks 0, 1, 3 did\)",
        log,
    ), log[-4000:]
    assert re.search(
        rf"\[job\] ranks ended with exit code \d+: {bad} marked bad; requeueing job {job} excluding {bad}\n", log
    ), log[-4000:]
    second = job_nodes(job)
    assert bad not in second and len(second) == 2 and scontrol_fields(job)["ExcNodeList"] == bad
    assert resumed_steps(log) == [10]
    assert_same_as_baseline(run, requeue_baseline)
    print(
        f"\n[hang] job {job}: first run on {','.join(first)}, restart on {','.join(second)}; fault -> [hang] line "
        f"{t_named - t_stop:.0f} s, fault -> requeued {t_requeued - t_stop:.0f} s; whole test "
        f"{time.monotonic() - t0:.0f} s"
    )
