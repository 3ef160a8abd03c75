"""Failures during an in-job restart, on the local cluster: each ends in a restart or Slurm's requeue within a bound,
never a lost job.

One job (the fault catalogue's: dp2 x tp2 on 2 nodes + 1 spare, HPC_DIST_TIMEOUT_S=15) meets, one per start of its
ranks: a rank SIGKILLed before the first checkpoint (restarted from step 0); the spare that restart brought in losing
its rank while the ranks still start (a second fault before the first step); the node the next restart brings in set
DOWN while the ranks start on it (Slurm takes it out of the job and kills the step: restarted on the nodes left); then,
training, the batch host's node set DOWN (under --no-kill Slurm ends the job without a requeue: hpc.node.batch_host's
watch on another node requeues it, or on 26.05 the batch script left running does). The requeued run ends equal to the
uninterrupted baseline bit for bit. Printed: per fault, the seconds to the restart (or requeue) and to training again,
and the steps lost.
"""

import os
import re
import signal
import subprocess
import time

import pytest

from hpc.node.attempt import read
from hpc.node.contract import ENDED_STATES
from hpc.node.restart import read_log
from hpc.slurm_query import job_state, scontrol_fields
from slurm.requeue_checks import assert_completed, assert_same_as_baseline, batch_log, restarts, submit, wait_for
from slurm.spare_checks import Run, signal_rank, spare_site

pytestmark = pytest.mark.slurm

TIMEOUT_S = 15
BOUND_S = 2 * TIMEOUT_S + 120  # twice the hang deadline plus a restart (the catalogue's 120 s on this shared machine)


def decided(run: Run, a: int) -> dict:
    """Attempt ``a``'s decision once the next attempt was started (its nodes recorded)."""

    def found():
        rec = next((r for r in read_log(run.dir / "restarts.jsonl", run.job) if r.get("attempt") == a), None)
        return rec if rec and "next_nodes" in rec else None

    return wait_for(found, timeout=BOUND_S, poll=0.2, what=f"the restart after attempt {a}")


def starting(run: Run, a: int, node: str) -> list[dict]:
    """Attempt ``a``'s ranks on ``node``, once started and before the attempt's first step."""
    recs = wait_for(
        lambda: [s for s in read(run.attempt(a)).starts if s["node"] == node],
        timeout=120,
        poll=0.05,
        what=f"attempt {a}'s ranks on {node}",
    )
    assert not read(run.attempt(a)).progress.get("trained_at"), "the attempt trained before the fault"
    return recs


def node_state(node: str, state: str) -> None:
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", f"state={state}", *(["reason=test"] if state != "resume" else [])],
        capture_output=True,
    )


def timing(name: str, t: float, rec: dict, lost) -> dict:
    """One line of the fault table: seconds from the fault to the ranks started again and to training again."""
    out = {"fault": name, "kind": rec.get("kind"), "lost": lost}
    for key, at in (("restarted", rec.get("relaunched_at")), ("training again", rec.get("trained_at"))):
        if at is not None:
            out[key] = at - t
    return out


def test_failures_during_recovery_end_in_a_restart_or_a_requeue(slurm, tmp_path, requeue_baseline, monkeypatch):
    t0 = time.time()
    monkeypatch.setenv("HPC_DIST_TIMEOUT_S", str(TIMEOUT_S))
    site = str(spare_site(tmp_path))
    run = Run(tmp_path, "recovery", submit(tmp_path, "recovery", "srun", "--spare-nodes", "1", site=site))
    touched: list[str] = []
    rows = []
    try:
        run.wait_step(0, 2)  # the first checkpoint is step 5's
        t, bad = signal_rank(run, 0, 2, signal.SIGKILL)
        rec = decided(run, 0)
        assert (rec["kind"], rec["action"], rec["nodes"]) == ("died", "restart", [bad]), rec
        spare = rec["replaced"][bad]
        rows.append(timing("SIGKILL of a rank before the first checkpoint", t, rec, rec["step"]))

        recs = starting(run, 1, spare)  # the spare's ranks started, the attempt has not trained
        t = time.time()
        os.kill(recs[0]["pid"], signal.SIGKILL)
        rec = decided(run, 1)
        assert (rec["kind"], rec["action"], rec["nodes"]) == ("died", "restart", [spare]), rec
        assert rec["replaced"] == {spare: bad}, rec
        rows.append(timing("the spare's rank SIGKILLed while the restarted ranks start (before step 1)", t, rec, 0))

        starting(run, 2, bad)  # the node this restart brought in: set DOWN while its ranks start
        touched.append(bad)
        t = time.time()
        node_state(bad, "down")
        rec = run.decision(2, timeout=BOUND_S)
        assert (rec["kind"], rec["action"], rec["nodes"]) == ("vanished", "restart", [bad]), rec
        assert rec["replaced"] == {bad: spare} and rec["resumed_step"] == 0, rec
        rows.append(timing("the node a restart brings in set DOWN while the ranks start", t, rec, 0))
        assert bad not in scontrol_fields(run.job)["NodeList"]

        run.wait_step(3, 12)  # step 10's checkpoint saved
        host = scontrol_fields(run.job)["BatchHost"]
        assert host in rec["next_nodes"], rec  # the batch host runs ranks
        touched.append(host)
        t = time.time()
        node_state(host, "down")
        node_state(host, "drain")  # it answers at once here: kept out of the requeued run, which its stale job
        lost_at = read(run.attempt(3)).progress["step"]  # would hold (Slurm drains a node holding a duplicate job)
        wait_for(lambda: restarts(run.job) >= 1, timeout=60, what="Slurm's requeue")
        second = run.dir / f".restarts-{run.job}-1" / "attempt-0"
        progress = wait_for(lambda: read(second).progress.get("trained_at") and read(second).progress, BOUND_S)
        rows.append(
            {
                "fault": "the batch host's node set DOWN while training",
                "kind": "requeued",
                "lost": lost_at - progress["resumed_step"],
                "training again": progress["trained_at"] - t,
            }
        )
        assert_completed(run.job, run.dir, timeout=900)
    finally:
        if job_state(run.job) not in ENDED_STATES:
            subprocess.run(["scancel", run.job], capture_output=True)
        for node in touched:
            node_state(node, "resume")
    assert_same_as_baseline(run.dir, requeue_baseline)
    assert restarts(run.job) == 1
    log = batch_log(run.dir, run.job)
    assert f"[restart] Slurm took {bad} out of job {run.job}" in log, log[-3000:]
    # the watch requeues the job once its batch host left it; Slurm 26.05 may keep the batch script running on the
    # DOWN node instead, and the script requeues it once the restart program ended the ranks, excluding the host
    watch = (run.dir / f".restarts-{run.job}-0" / "batch-host-watch-0.out").read_text()
    assert re.search(
        rf"\[batch host\] the watch on \S+: the batch host {host} left job {run.job} .*requeueing", watch
    ) or re.search(
        rf"\[job\] ranks ended with exit code \d+: \S+ marked bad; requeueing job {run.job} excluding {host}\b", log
    ), watch + log[-3000:]
    print(f"\n[recovery] job {run.job} in {time.time() - t0:.0f} s; the requeued run equal to the baseline bit for bit")
    for r in rows:
        times = ", ".join(f"{k} {r[k]:.1f} s" for k in ("restarted", "training again") if k in r)
        print(f"[recovery] {r['fault']}: {r['kind']}; {times}; {r['lost']} step(s) lost")
    for r in rows:
        assert max(r.get("restarted", 0), r.get("training again", 0)) < BOUND_S, r
