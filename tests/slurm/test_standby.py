"""Each node's standby on the local cluster: a job with a spare node (dp2 x tp2 on 2 nodes + 1) has hpc.node.restart
start hpc.node.standby on its 3 nodes once the ranks train; a rank SIGKILLed before the standbys have imported torch
is restarted as before (new processes), one SIGKILLed after is restarted from the standbys (every rank of that start
forked, its log line names its pid); the job ends equal to the uninterrupted baseline bit for bit. Printed: seconds
from each fault to training again, and whether its ranks were forked."""

import re
import signal
import subprocess
import time

import pytest

from hpc.node.attempt import read
from hpc.node.contract import ENDED_STATES
from hpc.slurm_query import job_state
from slurm.requeue_checks import assert_completed, assert_same_as_baseline, submit, wait_for
from slurm.spare_checks import Run, signal_rank, spare_site

pytestmark = pytest.mark.slurm

FORKED = re.compile(r"forked by the node's standby \(pid (\d+)\)")


def forked_pids(run: Run) -> set[int]:
    return {int(p) for f in run.dir.glob(f"{run.job}_*_log.out") for p in FORKED.findall(f.read_text())}


def test_a_rank_restarted_once_the_standbys_are_ready_is_forked_from_them(
    slurm, tmp_path, requeue_baseline, monkeypatch
):
    monkeypatch.setenv("HPC_DIST_TIMEOUT_S", "15")
    run = Run(
        tmp_path, "standby", submit(tmp_path, "standby", "srun", "--spare-nodes", "1", site=str(spare_site(tmp_path)))
    )
    standby_logs = run.dir / f".restarts-{run.job}-0"
    rows = []
    try:
        run.wait_step(0, 2)
        t, _ = signal_rank(run, 0, 1, signal.SIGKILL)
        rec = run.decision(0)
        rows.append((1, rec["trained_at"] - t))
        wait_for(
            lambda: sum("imported in" in p.read_text() for p in standby_logs.glob("standby-*.out")) == 3,
            timeout=300,
            what="the 3 nodes' standbys ready",
        )
        run.wait_step(1, rec["resumed_step"] + 3)
        t, _ = signal_rank(run, 1, 1, signal.SIGKILL)
        rec = run.decision(1)
        rows.append((2, rec["trained_at"] - t))
        assert_completed(run.job, run.dir, timeout=900)
    finally:
        if job_state(run.job) not in ENDED_STATES:
            subprocess.run(["scancel", run.job], capture_output=True)
    assert_same_as_baseline(run.dir, requeue_baseline)
    forked = forked_pids(run)
    assert {s["pid"] for s in read(run.attempt(2)).starts} <= forked, forked
    assert not {s["pid"] for s in read(run.attempt(0)).starts} & forked
    for attempt, seconds in rows:
        pids = {s["pid"] for s in read(run.attempt(attempt)).starts}
        how = "forked from the standbys" if pids <= forked else ("partly forked" if pids & forked else "new processes")
        print(f"\n[standby] SIGKILL of a rank -> attempt {attempt}: training again {seconds:.1f} s after ({how})")
    print(f"[standby] job {run.job} done at {time.strftime('%H:%M:%S')}, equal to the baseline bit for bit")
