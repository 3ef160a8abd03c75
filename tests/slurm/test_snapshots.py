"""Memory snapshots on the local cluster: a node lost long after the disk checkpoint costs at most the steps since the
newest snapshot.

One job (the fault catalogue's: dp2 x tp2 on 2 nodes + 1 spare, the tiny Qwen3, HPC_DIST_TIMEOUT_S=15) checkpoints to
disk every 20 steps and snapshots every 2 (checkpoint.memory_every=2). Past step 30, as soon as a snapshot is complete
on every rank, every process of the second node is killed at once and the node's snapshot directory deleted (its
memory lost with it). The restart on the spare resumes from that snapshot, not from step 20's checkpoint: the spare's
ranks receive their states from the surviving node (their partner copies), at most 2 steps are lost, and the job ends
equal to the uninterrupted baseline bit for bit (per-step losses, grad norms, data positions, exported weights); its
snapshot directory is gone at the end. Printed: the fault table's row (seconds from the fault to training again, split,
and the steps lost), the snapshot's bytes per rank and per step sent to the partner, and the step time with snapshots
against the baseline's.
"""

import re
import shutil
import statistics
import time

import pytest

from hpc.node.contract import SNAPSHOT_DIR_VAR
from slurm.requeue_checks import assert_completed, assert_same_as_baseline, batch_log, submit, wait_for
from slurm.spare_checks import Run, kill_node, row, spare_site

pytestmark = pytest.mark.slurm

TIMEOUT_S = 15
EVERY = 2
SNAPSHOT_LINE = re.compile(
    r"memory snapshot of step \d+ copied to host memory in ([\d.]+) s; the one of step \d+: "
    r"([\d,]+) bytes per rank"
)


def complete(job_dir, step: int) -> bool:
    """Every rank marked the snapshot of ``step`` complete (2 markers in each of the 2 nodes' directories)."""
    return len(list(job_dir.glob(f"*/step-{step:08d}/done-rank-*"))) == 4


def step_times(run_dir) -> list[float]:
    """Each step's wall time but the first of a start and the step after a disk checkpoint."""
    import json

    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step_time_s"] for r in recs if r["step"] % 20 != 1 and r["step"] > 1 and "step_time_s" in r]


def test_a_lost_node_resumes_from_the_newest_memory_snapshot(slurm, tmp_path, requeue_baseline, monkeypatch):
    t0 = time.time()
    monkeypatch.setenv("HPC_DIST_TIMEOUT_S", str(TIMEOUT_S))
    shm = tmp_path / "shm"  # this test's own, not the machine's /dev/shm: another cluster's job ids may be the same
    monkeypatch.setenv(SNAPSHOT_DIR_VAR, str(shm))
    site = str(spare_site(tmp_path))
    trainer = ("checkpoint.interval=20", f"checkpoint.memory_every={EVERY}")
    run = Run(
        tmp_path, "snapshots", submit(tmp_path, "snapshots", "srun", "--spare-nodes", "1", site=site, trainer=trainer)
    )
    job_dir = shm / f"{run.job}.0"
    run.wait_step(0, 30)
    step = wait_for(
        lambda: next((s for s in range(40, 28, -EVERY) if complete(job_dir, s)), None),
        timeout=120,
        poll=0.01,
        what="a complete snapshot past step 30",
    )
    t, node = kill_node(run, 0, 2)
    shutil.rmtree(job_dir / node)
    rec = run.decision(0)
    r = row("a node's processes killed at once and its memory lost, snapshots every 2 steps", rec, t, node)
    assert (rec["kind"], rec["action"], rec["nodes"]) == ("vanished", "restart", [node]), rec
    spare = rec["replaced"][node]
    assert rec["resumed_step"] >= step > 20 and r["lost"] <= EVERY, (rec, step)
    assert_completed(run.job, run.dir, timeout=900)
    assert_same_as_baseline(run.dir, requeue_baseline)
    assert not job_dir.exists()
    log = batch_log(run.dir, run.job) + "".join(p.read_text() for p in run.dir.glob(f"{run.job}_*_log.out"))
    resumed = re.search(
        rf"resumed from the memory snapshot of step {rec['resumed_step']} \(newest disk checkpoint: step 20; 2 "
        r"rank\(s\)' state sent by the nodes holding their partner copy \(rank (\d) from rank \d, rank (\d) from "
        r"rank \d\)\)",
        log,
    )
    assert resumed, log[-3000:]
    sizes = [int(m.group(2).replace(",", "")) for m in SNAPSHOT_LINE.finditer(log)]
    blocked = [float(m.group(1)) for m in SNAPSHOT_LINE.finditer(log)]
    times = step_times(run.dir)
    print(
        f"\n[snapshots] job {run.job} in {time.time() - t0:.0f} s: the snapshot of step {step} complete, then {node}'s "
        f"processes killed and its directory deleted; restarted on {spare}: training again from step "
        f"{rec['resumed_step']} ({r['lost']} step(s) lost; the disk checkpoint was step 20); "
        + ", ".join(f"{k} {v:.1f} s" for k, v in r["t"].items())
    )
    print(
        f"[snapshots] {sizes[0]:,} bytes per rank, {sizes[0] // EVERY:,} bytes per step sent to the partner by each "
        f"rank; the copy to host memory blocked the step loop {statistics.median(blocked) * 1000:.1f} ms (median); "
        f"step time median {statistics.median(times):.3f} s, mean {statistics.mean(times):.3f} s"
    )
