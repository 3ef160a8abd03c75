"""Preemption, requeue, time limits and crash safety on the real local cluster, on every road.

Every scenario trains the same tiny Qwen3 (dp2 x tp2 on 2 nodes) and is interrupted twice: first by a SIGKILL in
the middle of a checkpoint save or by ``scontrol requeue`` (with the save at the stop written in the background, or
not), then by Slurm's time-limit notice, which the batch script turns into its own requeue. After both, the per-step
loss and grad norm, the data position at every step and the exported weights must equal the uninterrupted baseline
bit for bit (CPU arithmetic is deterministic), so no sample was trained twice or skipped. The roads here: the
``--emit``ted file under plain ``sbatch``, ``--launcher torchrun`` and ``--launcher accelerate``; the fourth,
``hpc.submit`` with srun (one task per GPU), runs in a container in test_container.py.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_cli, wait_job
from train_helpers import TINY

from slurm.requeue_checks import (
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


def sigkill_in_save(job: str, run: Path, tmp_path: Path) -> None:
    """Every rank SIGKILLed while a checkpoint is being written: the job fails; requeued by hand, it resumes from
    the previous complete checkpoint."""
    ckpt = tmp_path / "checkpoints" / run.name
    wait_for(
        lambda: ckpt.is_dir() and any(p.name == "step-00000005" for p in ckpt.iterdir()),
        timeout=900,
        what="first checkpoint",
    )
    tmp = wait_for(lambda: [p for p in ckpt.iterdir() if ".tmp-" in p.name], poll=0.002, what="a save in progress")[0]
    ranks = subprocess.run(["pgrep", "-f", f"checkpoint.dir={ckpt}"], capture_output=True, text=True).stdout.split()
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):  # srun --kill-on-bad-exit may have ended it after the first kill
            os.kill(int(pid), signal.SIGKILL)
    assert len(ranks) >= 4  # the four ranks (and their hpc.node.launch supervisors)
    assert wait_job(job) in ("FAILED", "CANCELLED")
    assert tmp.exists(), "the kill did not land inside the save"
    complete = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-") and ".tmp-" not in p.name)
    assert complete and complete[-1] < tmp.name.split(".tmp-")[0]
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_resumed(job, run, 1)
    log = batch_log(run, job)
    assert f"resumed from {ckpt / complete[-1]}" in log
    assert f"removed {tmp.name}, left half-written by a run that ended" in log
    assert "took over the lease of checkpoint.dir" in log and "(requeued)" in log


def scontrol_requeue(job: str, run: Path, tmp_path: Path) -> None:
    wait_for(
        lambda: steps_done(run) >= 12, timeout=900, what="12 steps"
    )  # the shared cluster may hold the job pending first
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_resumed(job, run, 1)
    assert "got SIGTERM" in batch_log(run, job)


FIRST = {"sigkill-in-save": sigkill_in_save, "scontrol-requeue": scontrol_requeue}
SCENARIOS = [
    ("emitted", "sigkill-in-save", False),
    ("torchrun", "scontrol-requeue", True),
    ("accelerate", "scontrol-requeue", False),
]


@pytest.mark.parametrize("road,first,async_save", SCENARIOS, ids=[f"{r}-{f}" for r, f, _ in SCENARIOS])
def test_interrupted_then_time_limit_resumes_exactly(slurm, tmp_path, requeue_baseline, road, first, async_save):
    """With async_save the stop also commits the interval save still being written, then saves the stop step."""
    t0 = time.time()
    job = submit(tmp_path, "requeue", road, trainer=(f"checkpoint.async_save={str(async_save).lower()}",))
    run = tmp_path / "jobs" / "requeue"
    FIRST[first](job, run, tmp_path)
    time_limit_notice(job)
    assert_completed(job, run)
    n = restarts(job)
    print(f"\n[requeue] {road}: {first}, then the time-limit notice: {n} restarts, {time.time() - t0:.0f} s wall")
    log = batch_log(run, job)
    assert n >= 2 and len(resumed_steps(log)) == n and f"restart {n}" in log
    assert log.count("got SIGUSR2") >= 1 and log.count("[job] stopped with a checkpoint saved; requeueing job") >= 1
    assert ("writing in the background" in log) == async_save
    assert_same_as_baseline(run, requeue_baseline)


def _start_end(job: str) -> tuple[str, str]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job, "-o", "Start,End"], capture_output=True, text=True
    ).stdout
    start, end = out.strip().splitlines()[-1].split("|")
    return start, end


def test_one_emitted_script_submitted_twice_runs_once(slurm, tmp_path, requeue_baseline):
    """Submitted again once the first runs (``--dependency=after``: the two may start together): of two jobs that run
    at the same time, the one whose rank 0 takes the checkpoint directory's lease trains and the other is refused
    (exit 2, nothing written, no requeue); one that Slurm starts only after the first ended finds the run done. Either
    way the run completes bitwise equal to the baseline."""
    first = submit(tmp_path, "twice", "emitted")
    sb = subprocess.run(
        ["sbatch", "--parsable", f"--dependency=after:{first}", str(tmp_path / "twice.sbatch")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert sb.returncode == 0, sb.stderr
    second, run = sb.stdout.strip(), tmp_path / "jobs" / "twice"
    states = {second: wait_job(second, timeout=1200), first: wait_job(first, timeout=600)}
    overlapped = _start_end(second)[0] < _start_end(first)[1]  # ISO times compare as text
    print(f"\n[lease] the second job {'ran beside' if overlapped else 'started after'} the first: {states}")
    completed = [j for j, state in states.items() if state == "COMPLETED"]
    if len(completed) == 1:  # they ran at the same time: the one whose rank 0 took the lease trained
        loser = first if completed == [second] else second
        log = batch_log(run, loser)
        assert overlapped and states[loser] == "FAILED", log[-3000:]
        assert (
            f"is in use by Slurm job {completed[0]} 'twice'" in log and ": not requeued" in log
        )  # exit 2, or srun's kill
        assert restarts(loser) == 0 and "Traceback" not in log
    else:  # the second started once the first had released the lease: the run was done
        assert len(completed) == 2, {j: batch_log(run, j)[-2000:] for j in states}
        assert "nothing to train" in batch_log(run, second), batch_log(run, second)[-3000:]
    assert_same_as_baseline(run, requeue_baseline)


def test_an_error_in_training_is_shown_and_not_requeued(slurm, tmp_path):
    """A corpus that exists (so the submit-time checks pass) but whose second line is not JSON: every rank stops with
    one line (exit 2), the job FAILs, the batch script does not requeue it, and --wait shows rank 0's error live."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "a line of text"}) + "\n{not json\n")
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        "broken",
        "--wait",
        "--",
        "--config",
        str(TINY),
        "parallel.tp=2",
        f"data.path={corpus}",
        cwd=tmp_path,
    )
    assert r.returncode == 1
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    assert restarts(job) == 0
    assert f"data.path: {corpus}:2 is not valid JSON" in r.stdout  # rank 0's error, followed live
    assert "[job] ranks ended with exit code 2: not requeued" in r.stdout
    assert "Traceback" not in r.stdout
