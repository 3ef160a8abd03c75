"""Ways a run could lose work, through the real `python -m train` on CPU: done is not stopped, a stop
notice is acted on at the next step whatever the logging cadence, a checkpoint that fails to load is set
aside, a save that fails leaves the previous checkpoints intact, and a directory of another job is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from train_helpers import ROOT, clean_env, metrics, start_endless, train_cmd

from hpc.node.contract import EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED, EXIT_STOPPED
from train.checkpoint import complete_checkpoints, step_dir


def run(run_dir, *overrides, timeout=180, **env):
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        train_cmd(1, f"log.dir={run_dir}", *overrides),
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_finished_run_started_again_with_fewer_steps_is_done(tmp_path):
    first = run(tmp_path / "r", "steps=6", "checkpoint.interval=3")
    assert first.returncode == EXIT_DONE, first.stderr[-2000:]
    again = run(tmp_path / "r", "steps=4", "schedule.warmup_steps=2", "export=hf")
    assert again.returncode == EXIT_DONE, again.stderr[-2000:]
    assert "the run is already at step 6 of steps=4: nothing to train" in again.stdout
    assert "[preempt]" not in again.stdout + again.stderr
    assert (tmp_path / "r" / "hf" / "config.json").is_file()  # export, as asked
    assert max(metrics(tmp_path / "r")) == 6


def test_a_stop_notice_is_acted_on_at_the_next_step_with_rare_log_lines(tmp_path):
    """log_every far beyond the run: the notice still stops the run after the next step, with a checkpoint of it."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    with (run_dir / "out.log").open("w") as out:
        proc = start_endless(run_dir, out)
        deadline = time.time() + 120
        while not (run_dir / "metrics.jsonl").exists() or len(metrics(run_dir)) < 3:
            assert proc.poll() is None and time.time() < deadline, (run_dir / "out.log").read_text()[-2000:]
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGUSR2)
        t0 = time.time()
        rc = proc.wait(timeout=60)
    log = (run_dir / "out.log").read_text()
    assert rc == EXIT_STOPPED, log[-2000:]
    last = max(metrics(run_dir))
    saved = [s for s, _ in complete_checkpoints(run_dir / "checkpoints")]
    # the stop's checkpoint is the newest; before it at most the periodic ones (checkpoint.interval 10: the tiny
    # model's steps are fast enough to pass step 10 between the test reading metrics.jsonl and the signal)
    assert saved[-1] == last and all(s % 10 == 0 for s in saved[:-1]), saved
    assert f"[preempt] stopped at step {last} of 100000 after SIGUSR2, checkpoint saved" in log
    print(f"\n[stop] exit {rc} {time.time() - t0:.1f} s after the notice, at step {last}")


def test_a_checkpoint_that_fails_to_load_is_set_aside_and_the_older_one_loaded(tmp_path):
    run_dir = tmp_path / "r"
    first = run(run_dir, "steps=6", "checkpoint.interval=3", "checkpoint.keep_last=5")
    assert first.returncode == EXIT_DONE, first.stderr[-2000:]
    original = metrics(run_dir)
    newest = step_dir(run_dir / "checkpoints", 6)
    meta = newest / ".metadata"
    meta.write_bytes(b"\0" * meta.stat().st_size)  # same size: the manifest still matches, the load fails
    again = run(run_dir, "steps=8", "checkpoint.interval=3", "checkpoint.keep_last=5")
    assert again.returncode == EXIT_DONE, again.stderr[-2000:]
    assert f"resumed from {step_dir(run_dir / 'checkpoints', 3)} (step 3" in again.stdout
    aside = [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-00000006.bad-")]
    assert len(aside) == 1 and "set aside as" in again.stdout and (aside[0] / "WHY.txt").is_file()
    redone = metrics(run_dir)
    for step in (4, 5, 6):  # the steps after the older checkpoint come out as they did the first time
        assert redone[step]["loss"] == original[step]["loss"], step
    assert sorted(redone) == list(range(1, 9))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_a_save_on_a_full_disk_fails_in_one_line_and_keeps_the_previous_checkpoints(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(disk)], check=True)
    try:
        r = run(
            tmp_path / "r",
            "steps=12",
            "checkpoint.interval=3",
            "checkpoint.keep_last=5",
            f"checkpoint.dir={disk / 'ckpt'}",
        )
        kept = [s for s, _ in complete_checkpoints(disk / "ckpt")]
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    assert r.returncode == EXIT_FAILED, r.stdout[-2000:] + r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("train: error:")]
    assert len(errors) == 1 and "checkpoint of step" in errors[0] and "MiB free in" in errors[0], r.stderr[-3000:]
    assert errors[0].endswith("the previous checkpoints are kept")
    assert "Traceback" not in r.stderr
    assert kept and kept == list(range(3, kept[-1] + 1, 3)) and kept[-1] < 12  # every earlier save complete


def test_directories_of_another_job_are_refused_before_training(tmp_path):
    first = run(tmp_path / "r", "steps=2", "schedule.warmup_steps=1", HPC_JOB_NAME="exp 1")
    assert first.returncode == EXIT_DONE, first.stderr[-2000:]
    other = run(tmp_path / "r", "steps=4", "schedule.warmup_steps=1", HPC_JOB_NAME="exp_1")
    assert other.returncode == EXIT_BAD_INPUT
    assert other.stderr.strip().splitlines() == [
        f"train: error: log.dir {tmp_path / 'r'} belongs to job 'exp 1' (its .owner.json); "
        "this job is 'exp_1': pick another job name or directory"
    ]
    assert max(metrics(tmp_path / "r")) == 2
