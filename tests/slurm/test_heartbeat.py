"""Hangs seen in seconds on the local cluster (hpc/node/heartbeat.py, hpc/node/hang_deadlines.py): in one job with a
spare node and the default collective timeout (300 s), rank 0's checkpoint save slowed to 90 s (HPC_TEST_FAULTS
slow-save) is no hang, then a rank stopped (SIGSTOP) is named with its node by its silent heartbeat within 30 s and
the ranks train again on the spare."""

import signal
import subprocess
import time

import pytest

from hpc.node.attempt import read
from hpc.node.restart import read_log
from slurm.requeue_checks import batch_log, submit
from slurm.spare_checks import Run, row, signal_rank, spare_site

pytestmark = pytest.mark.slurm


def test_a_slow_save_is_no_hang_and_a_stopped_rank_is_named_within_seconds(slurm, tmp_path, monkeypatch):
    t0 = time.time()
    monkeypatch.delenv("HPC_DIST_TIMEOUT_S", raising=False)
    monkeypatch.setenv("HPC_TEST_FAULTS", "slow-save@0:10")
    run = Run(
        tmp_path, "beats", submit(tmp_path, "beats", "srun", "--spare-nodes", "1", site=str(spare_site(tmp_path)))
    )
    try:
        run.wait_step(0, 10)
        t_save = time.time()
        run.wait_step(0, 12, timeout=600)
        slow = time.time() - t_save
        assert slow > 80, f"the save was not slowed ({slow:.0f} s)"
        assert read_log(run.dir / "restarts.jsonl", run.job) == [], "a slowed save was taken for a hang"
        beats = read(run.attempt(0)).beats
        assert len(beats) == 4 and max(b["save_s"] for b in beats) > 80, beats
        t, node = signal_rank(run, 0, 3, signal.SIGSTOP)
        rec = run.decision(0)
        assert (rec["kind"], rec["action"], rec["nodes"]) == ("hang", "restart", [node]), rec
        assert f"a heartbeat went silent: rank 3 on {node} silent" in rec["what"], rec
        detection = rec["seen_at"] - t
        assert detection < 30, rec
        r = row("SIGSTOP of a rank (heartbeat)", rec, t, node)
        log = batch_log(run.dir, run.job)
        assert "[hang] a collective timed out" not in log  # seen by the heartbeat, not the collective timeout
        times = ", ".join(f"{k} {v:.1f} s" for k, v in r["t"].items())
        print(
            f"\n[beats] job {run.job}: a save slowed to {slow:.0f} s, no alarm; rank 3 stopped on {node}: "
            f"{r['lost']} step(s) lost; {times}; {time.time() - t0:.0f} s in all"
        )
    finally:
        subprocess.run(["scancel", run.job], capture_output=True)
