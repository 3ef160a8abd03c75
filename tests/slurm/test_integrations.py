"""A user's TRL SFTTrainer script with RequeueCallback under ``--launcher accelerate`` on 2 nodes of the local
cluster (4 CPU ranks): Slurm's pre-stop signal reaches every process of the job's step (``scancel --signal``, which
the time-limit notice also goes through); every rank stops after the same step and saves, the batch script requeues
the job, and the next run resumes on newest_complete_checkpoint and completes, each step trained once. A script
without the callback is told so in the job log at the same notice."""

import json
import re
import subprocess
import time

import pytest
from conftest import ROOT, run_cli
from train_helpers import tiny_hf_chat

from slurm.requeue_checks import assert_completed, batch_log, restarts, wait_for

pytestmark = pytest.mark.slurm
STEPS = 24


def test_trl_script_with_the_callback_is_stopped_requeued_and_completes(slurm, tmp_path):
    t0 = time.time()
    model, data = tiny_hf_chat(tmp_path, rows=32)
    out = tmp_path / "out"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--launcher",
        "accelerate",
        "--job-name",
        "trl",
        "--max-requeues",
        "3",
        "--",
        str(ROOT / "tests" / "scripts" / "trl_sft.py"),
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(out),
        "--max-steps",
        str(STEPS),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    run = tmp_path / "jobs" / "trl"
    losses = out / "losses.jsonl"
    wait_for(lambda: losses.exists() and len(losses.read_text().splitlines()) >= 3, timeout=600, what="3 steps")
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    wait_for(lambda: restarts(job) >= 1, timeout=300, what="the requeue after the notice")
    assert_completed(job, run)
    print(f"\n[integrations] TRL on 2 nodes, accelerate: stopped, requeued, completed in {time.time() - t0:.0f} s")

    log = batch_log(run, job)
    stop = int(re.search(r"\[requeue\] stopped at step (\d+) of 24 after SIGUSR2", log).group(1))
    assert restarts(job) == 1 and "[job] stopped with a checkpoint saved; requeueing job" in log
    assert "does not catch it" not in log
    steps = [json.loads(line)["step"] for line in losses.read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1)) and 3 <= stop < STEPS  # every step once: resumed at stop + 1
    assert (out / f"checkpoint-{STEPS}" / "meta.json").is_file() and (out / "final" / "model.safetensors").is_file()


NO_CATCH = """import os, time
print(f"[plain] rank {os.environ['RANK']} ready", flush=True)
time.sleep(15)
print(f"[plain] rank {os.environ['RANK']} trained on", flush=True)
"""


def test_a_script_without_the_callback_is_told_in_the_job_log_at_the_notice(slurm, tmp_path):
    """The same notice reaches a script that does not catch it (torchrun, 2 nodes): each rank's log says so, with the
    one line that would have saved it; the script trains on and the job ends as it does (here COMPLETED)."""
    script = tmp_path / "plain.py"
    script.write_text(NO_CATCH)
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--launcher",
        "torchrun",
        "--job-name",
        "plain",
        "--",
        str(script),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    run = tmp_path / "jobs" / "plain"

    def logs() -> str:
        return "".join(p.read_text() for p in run.glob(f"{job}_*_log.out"))

    wait_for(lambda: logs().count("ready") == 4, timeout=300, what="4 ranks started")
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    assert_completed(job, run)
    text = logs()
    for rank in range(4):
        assert re.search(
            rf"\[launch\] rank {rank} on \S+: got SIGUSR2, the notice to save and stop, but the script "
            "does not catch it",
            text,
        ), text[-3000:]
    assert text.count("trainer.add_callback(RequeueCallback())") == 4 and text.count("trained on") == 4
