"""Preemption, requeue and crash safety on the real local cluster, on every road.

Every scenario trains the same tiny Qwen3 (dp2 x tp2 on 2 nodes) as an uninterrupted torchrun
baseline; after the interruptions the per-step loss and grad norm, the data position at every
step and the exported weights must equal the baseline bit for bit (CPU arithmetic is
deterministic), so no sample was trained twice or skipped. The roads: ``hpc.submit`` (srun,
one task per GPU), the ``--emit``ted file under plain ``sbatch``, ``--launcher torchrun`` and
``--launcher accelerate``. The time-limit notice on every road is in test_time_limit.
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
from safetensors.torch import load_file

from conftest import run_cli, wait_job
from hpc.slurm_query import scontrol_fields
from train_helpers import TINY, finish, launch

pytestmark = pytest.mark.slurm

STEPS = 60
OVERRIDES = ("parallel.tp=2", f"steps={STEPS}", "checkpoint.interval=5", "checkpoint.keep_last=3",
             "log.log_every=20", "export=hf")
SIGNAL_LEAD_S = 100
ROADS = ("srun", "emitted", "torchrun", "accelerate")


def _baseline(tmp_path_factory, *extra: str) -> Path:
    run = tmp_path_factory.mktemp("baseline")
    finish(launch(4, run, *OVERRIDES, *extra, f"checkpoint.dir={run / 'ckpt'}"), run, timeout=600)
    return run


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    return _baseline(tmp_path_factory)


def submit(cwd: Path, name: str, road: str = "srun", *flags: str, trainer: tuple[str, ...] = ()) -> str:
    """Submit the test job on ``road``; returns the job id."""
    launcher = road if road in ("torchrun", "accelerate") else "srun"
    args = ["-m", "hpc.submit", "--site", "local", "--nodes", "2", "--job-name", name, "--max-requeues", "20",
            "--launcher", launcher, "--signal-lead", str(SIGNAL_LEAD_S), *flags]
    script = cwd / f"{name}.sbatch"
    if road == "emitted":
        args += ["--emit", str(script)]
    r = run_cli(*args, "--", "--config", str(TINY), *OVERRIDES, *trainer, cwd=cwd)
    assert r.returncode == 0, r.stderr
    if road != "emitted":
        return re.search(r"submitted job (\d+)", r.stdout).group(1)
    sb = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=cwd)
    assert sb.returncode == 0, sb.stderr
    return sb.stdout.strip()


def steps_done(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for(cond, timeout: float = 300, poll: float = 0.5, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what} not reached in {timeout} s")


def restarts(job_id: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return int(re.search(r"Restarts=(\d+)", out).group(1))


def assert_same_as_baseline(run: Path, baseline: Path) -> None:
    got = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    want = [json.loads(l) for l in (baseline / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, len(want) + 1))  # every step once, in order
    for g, w in zip(got, want):
        assert (g["loss"], g["grad_norm"], g["samples_consumed"], g["epoch"]) == \
               (w["loss"], w["grad_norm"], w["samples_consumed"], w["epoch"]), f"step {g['step']}"
    a, b = load_file(run / "hf" / "model.safetensors"), load_file(baseline / "hf" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].equal(b[k]), k


def batch_log(run: Path, job_id: str) -> str:
    return (run / f"{job_id}_0_log.out").read_text()


def assert_completed(job_id: str, run: Path, timeout: float = 600) -> None:
    state = wait_job(job_id, timeout=timeout)
    log = run / f"{job_id}_0_log.out"
    assert state == "COMPLETED", f"job {job_id} {state}; its log ends:\n" + (log.read_text()[-3000:] if log.exists() else "(none)")


def test_preempted_by_high_priority_job_resumes(slurm, tmp_path, baseline):
    t0 = time.time()
    job = submit(tmp_path, "preempt", "srun", "--partition", "low")
    run = tmp_path / "jobs" / "preempt"
    wait_for(lambda: steps_done(run) >= 12, what="12 steps")
    nodes = scontrol_fields(job)["NodeList"]  # the high job wants exactly these nodes: it preempts this job and no other
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-N", "2", "-w", nodes, "-o", str(tmp_path / "high-%j.log"),
                           "--wrap", "sleep 2"], capture_output=True, text=True, check=True).stdout.strip()
    assert_completed(job, run)
    assert wait_job(high) == "COMPLETED"
    n = restarts(job)
    print(f"\n[requeue] preemption: {n} restarts, {time.time() - t0:.0f} s wall")
    assert n >= 1
    assert "got SIGUSR2" in batch_log(run, job)
    assert_same_as_baseline(run, baseline)


@pytest.mark.parametrize("road,async_save", [("srun", False), ("srun", True), ("emitted", False), ("torchrun", False),
                                             ("accelerate", False)],
                         ids=["srun-sync-save", "srun-async-save", "emitted", "torchrun", "accelerate"])
def test_scontrol_requeue_mid_run(slurm, tmp_path, baseline, road, async_save):
    """With async_save the stop also commits the interval save still being written, then saves the stop step."""
    t0 = time.time()
    job = submit(tmp_path, "requeue", road, trainer=(f"checkpoint.async_save={str(async_save).lower()}",))
    run = tmp_path / "jobs" / "requeue"
    wait_for(lambda: steps_done(run) >= 12, what="12 steps")
    subprocess.run(["scontrol", "requeue", job], check=True)
    assert_completed(job, run)
    n = restarts(job)
    print(f"\n[requeue] {road}: scontrol requeue ({'async' if async_save else 'sync'} save): {n} restarts, {time.time() - t0:.0f} s wall")
    log = batch_log(run, job)
    assert n >= 1 and "resumed from" in log
    assert ("writing in the background" in log) == async_save
    assert_same_as_baseline(run, baseline)
    if road == "srun" and not async_save:
        # the finished run submitted again with fewer steps: done at once, never requeued
        again = submit(tmp_path, "requeue", road, trainer=(f"steps={STEPS - 20}",))
        assert_completed(again, run)
        assert restarts(again) == 0
        log = batch_log(run, again)
        assert f"the run is already at step {STEPS} of steps={STEPS - 20}: nothing to train" in log
        assert "[job] done" in log and "requeueing" not in log


def test_sigkill_during_checkpoint_save_resumes_from_previous_complete(slurm, tmp_path, baseline):
    t0 = time.time()
    job = submit(tmp_path, "crash", "srun")
    run, ckpt = tmp_path / "jobs" / "crash", tmp_path / "checkpoints" / "crash"
    wait_for(lambda: ckpt.is_dir() and any(p.name == "step-00000005" for p in ckpt.iterdir()), what="first checkpoint")
    tmp = wait_for(lambda: [p for p in ckpt.iterdir() if p.name.endswith(".tmp")], poll=0.002, what="a save in progress")[0]
    ranks = subprocess.run(["pgrep", "-f", f"checkpoint.dir={ckpt}"], capture_output=True, text=True).stdout.split()
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):  # srun --kill-on-bad-exit may have ended it after the first kill
            os.kill(int(pid), signal.SIGKILL)
    assert len(ranks) >= 4  # the four ranks (and their hpc.node.launch supervisors)
    assert wait_job(job) in ("FAILED", "CANCELLED")
    assert tmp.exists(), "the kill did not land inside the save"
    complete = sorted(p.name for p in ckpt.iterdir() if not p.name.endswith(".tmp"))
    assert complete and complete[-1] < tmp.name.removesuffix(".tmp")
    subprocess.run(["scontrol", "requeue", job], check=True)
    assert_completed(job, run)
    log = batch_log(run, job)
    assert f"resumed from {ckpt / complete[-1]}" in log
    print(f"\n[requeue] SIGKILL in save of {tmp.name}: resumed from {complete[-1]}, {time.time() - t0:.0f} s wall")
    assert_same_as_baseline(run, baseline)


def test_an_error_in_training_is_shown_and_not_requeued(slurm, tmp_path):
    """A corpus that exists (so the submit-time checks pass) but whose second line is not JSON: every rank stops with
    one line (exit 2), the job FAILs, the batch script does not requeue it, and --wait shows rank 0's error live."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "a line of text"}) + "\n{not json\n")
    r = run_cli("-m", "hpc.submit", "--site", "local", "--nodes", "2", "--job-name", "broken", "--wait",
                "--", "--config", str(TINY), "parallel.tp=2", f"data.path={corpus}", cwd=tmp_path)
    assert r.returncode == 1
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    assert restarts(job) == 0
    assert f"data.path: {corpus}:2 is not valid JSON" in r.stdout  # rank 0's error, followed live
    assert "[job] ranks ended with exit code 2: not requeued" in r.stdout
    assert "Traceback" not in r.stdout
