"""A sweep as one Slurm array on the local cluster: a requeue of one task (`scontrol requeue ARRAY_TASK`, or its
time-limit notice, which the batch script turns into its own requeue) restarts that task alone, and it resumes bit
for bit. The swept key (checkpoint.keep_last) does not change the arithmetic, so the untouched task is the
uninterrupted run of the same training that the requeued ones must equal."""

import re
import subprocess
import time

import pytest
from conftest import run_cli
from train_helpers import TINY

from slurm.requeue_checks import (
    assert_completed,
    assert_same_as_baseline,
    restarts,
    steps_done,
    time_limit_notice,
    wait_for,
)

pytestmark = pytest.mark.slurm

# long enough to still be training when the time-limit notice comes (Slurm checks every 30 s), on a quiet machine too
STEPS = 300
OVERRIDES = (f"steps={STEPS}", "checkpoint.interval=5", "log.log_every=20", "export=hf")
KEEP = ("3", "4", "5")


def test_requeue_of_one_task_resumes_it_exactly_and_leaves_the_others(slurm, tmp_path):
    t0 = time.time()
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--job-name",
        "sweep",
        "--max-requeues",
        "3",
        "--signal-lead",
        "100",
        "--sweep",
        f"checkpoint.keep_last={','.join(KEEP)}",
        "--",
        "--config",
        str(TINY),
        *OVERRIDES,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    array = re.search(r"submitted job (\d+) .*an array of 3 tasks", r.stdout).group(1)
    jobs = tmp_path / "jobs" / "sweep"
    runs = [jobs / f"{i}-checkpoint.keep_last={k}" for i, k in enumerate(KEEP)]
    # task 2, the last, runs under the array's own job id: a requeue of $SLURM_JOB_ID there would requeue every task
    assert subprocess.run(["scontrol", "show", "job", f"{array}_2"], capture_output=True, text=True).stdout.startswith(
        f"JobId={array} "
    )

    # the cluster is shared: a task may wait a while for its node
    wait_for(lambda: steps_done(runs[1]) >= 12, timeout=900, what="12 steps of task 1")
    subprocess.run(["scontrol", "requeue", f"{array}_1"], check=True)
    wait_for(lambda: steps_done(runs[2]) >= 3, timeout=900, what="3 steps of task 2")
    time_limit_notice(f"{array}_2")
    for i in range(3):
        assert_completed(f"{array}_{i}", jobs)

    assert [restarts(f"{array}_{i}") for i in range(3)] == [0, 1, 1]
    logs = [(jobs / f"{array}_{i}_0_log.out").read_text() for i in range(3)]
    assert "resumed from" not in logs[0] and "resumed from" in logs[1] and "resumed from" in logs[2]
    assert f"[job] stopped with a checkpoint saved; requeueing job {array}_2 (restart 1 of at most 3)" in logs[2]
    assert f"[job] array task {array}_1: checkpoint.keep_last={KEEP[1]}" in logs[1]
    for run in runs[1:]:
        assert_same_as_baseline(run, runs[0])

    status = run_cli("-m", "hpc.jobs", "status", array)
    assert status.returncode == 0, status.stderr
    rows = sorted(line.split()[:4] for line in status.stdout.splitlines()[2:])
    assert rows == [
        [f"{array}_{i}", "COMPLETED", str(n), f"checkpoint.keep_last={k}"]
        for i, (n, k) in enumerate(zip((0, 1, 1), KEEP, strict=False))
    ]
    report = run_cli("-m", "hpc.jobs", "report", array, "--out", str(tmp_path / "sweep.png"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "sweep.png").stat().st_size > 0
    print(
        f"\n[sweep] array {array}: task 1 (scontrol requeue) and task 2 (time limit) restarted once each and resumed "
        f"exactly, task 0 untouched, {time.time() - t0:.0f} s wall"
    )
