"""Slurm's time-limit notice on every road: the job saves, requeues itself and resumes exactly.

The test shortens the running job's time limit (``scontrol update``) so that the ``--signal`` lead falls due at
once; after the requeue the run must equal an uninterrupted torchrun baseline bit for bit (see test_requeue).
"""
import math
import re
import subprocess
import time

import pytest

from hpc.slurm_query import scontrol_fields
from slurm.test_requeue import (
    ROADS, _baseline, assert_completed, assert_same_as_baseline, batch_log, restarts, steps_done, submit, wait_for,
)

pytestmark = pytest.mark.slurm

# The time-limit runs are longer: the notice comes at Slurm's next check of signal times (every
# 30 s), and the run must still be training then, also on a quiet machine.
LONG_STEPS = 150


@pytest.fixture(scope="module")
def long_baseline(tmp_path_factory):
    return _baseline(tmp_path_factory, f"steps={LONG_STEPS}")


def shorten_time_limit(job_id: str) -> None:
    """Set the running job's time limit so that its --signal lead is (nearly) due at once, with time left to
    save after Slurm's next check of signal times (every 30 s): 50 to 110 s remain."""
    h, m, sec = (int(x) for x in scontrol_fields(job_id)["RunTime"].split("-")[-1].split(":"))
    minutes = math.ceil((h * 3600 + m * 60 + sec + 50) / 60)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"], check=True)


@pytest.mark.parametrize("road", ROADS)
def test_time_limit_notice_requeues_and_resumes_exactly(slurm, tmp_path, long_baseline, road):
    t0 = time.time()
    job = submit(tmp_path, "timelimit", road, trainer=(f"steps={LONG_STEPS}",))
    run = tmp_path / "jobs" / "timelimit"
    wait_for(lambda: steps_done(run) >= 3, what="3 steps")
    limit = scontrol_fields(job)["TimeLimit"]
    shorten_time_limit(job)
    wait_for(lambda: restarts(job) >= 1, what="the requeue after the notice")
    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={limit}"], check=True)  # the next run has its time
    assert_completed(job, run)
    n = restarts(job)
    print(f"\n[requeue] {road}: time limit: {n} restart(s), {time.time() - t0:.0f} s wall")
    assert n >= 1
    log = batch_log(run, job)
    assert log.count("got SIGUSR2") >= n and f"restart {n}" in log
    assert len(re.findall(r"resumed from .*step-\d+", log)) == n
    assert log.count("[job] stopped with a checkpoint saved; requeueing job") == n
    assert_same_as_baseline(run, long_baseline)
