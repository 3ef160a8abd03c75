"""What the requeue scenarios share: the test job, waiting on it, Slurm's time-limit notice, and the bitwise
comparison with the uninterrupted baseline (the session fixture ``requeue_baseline`` in conftest.py)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from pathlib import Path

from conftest import run_cli, wait_job
from safetensors.torch import load_file
from train_helpers import TINY

from hpc.slurm_query import scontrol_fields

# Long enough to still be training at Slurm's next check of signal times (every 30 s) after the time limit is
# shortened, on a quiet machine too.
STEPS = 150
OVERRIDES = (
    "parallel.tp=2",
    f"steps={STEPS}",
    "checkpoint.interval=5",
    "checkpoint.keep_last=3",
    "log.log_every=20",
    "export=hf",
)
SIGNAL_LEAD_S = 100


def submit(
    cwd: Path, name: str, road: str = "srun", *flags: str, site: str = "local", trainer: tuple[str, ...] = ()
) -> str:
    """Submit the test job (2 nodes, dp2 x tp2) on ``road`` (srun, emitted, torchrun, accelerate); returns its id."""
    launcher = road if road in ("torchrun", "accelerate") else "srun"
    args = [
        "-m",
        "hpc.submit",
        "--site",
        site,
        "--nodes",
        "2",
        "--job-name",
        name,
        "--max-requeues",
        "20",
        "--launcher",
        launcher,
        "--signal-lead",
        str(SIGNAL_LEAD_S),
        *flags,
    ]
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
    return int(scontrol_fields(job_id)["Restarts"])


def batch_log(run: Path, job_id: str) -> str:
    path = run / f"{job_id}_0_log.out"
    return path.read_text() if path.exists() else ""


def resumed_steps(log: str) -> list[int]:
    """The step each run of the job resumed from, in order."""
    return [int(s) for s in re.findall(r"\[train\] resumed from \S+ \(step (\d+),", log)]


def wait_resumed(job_id: str, run: Path, times: int, timeout: float = 300) -> None:
    """Wait until the job's run number ``times`` + 1 resumed and trained 3 steps past its checkpoint."""

    def trained() -> bool:
        steps = resumed_steps(batch_log(run, job_id))
        return len(steps) >= times and steps_done(run) >= steps[-1] + 3

    wait_for(trained, timeout=timeout, what=f"resume number {times} and 3 steps past it")


def time_limit_notice(job_id: str) -> None:
    """Shorten the running job's time limit so that its --signal lead is (nearly) due at once, with 50 to 110 s left
    to save after Slurm's next check of signal times (every 30 s); wait for the requeue that follows and give the
    next run its time back."""
    fields = scontrol_fields(job_id)
    before, limit = int(fields["Restarts"]), fields["TimeLimit"]
    h, m, sec = (int(x) for x in fields["RunTime"].split("-")[-1].split(":"))
    minutes = math.ceil((h * 3600 + m * 60 + sec + 50) / 60)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"], check=True)
    wait_for(lambda: restarts(job_id) > before, what="the requeue after the time-limit notice")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={limit}"], check=True)


def assert_completed(job_id: str, run: Path, timeout: float = 600) -> None:
    state = wait_job(job_id, timeout=timeout)
    assert state == "COMPLETED", f"job {job_id} {state}; its log ends:\n" + (batch_log(run, job_id)[-3000:] or "(none)")


def assert_same_as_baseline(run: Path, baseline: Path) -> None:
    """Every step once, in order, with the baseline's loss, grad norm and data position, and the same exported
    weights (the run's event records, such as a hang at the step it resumed from, are not steps)."""
    got = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    got = [r for r in got if "event" not in r]
    want = [json.loads(line) for line in (baseline / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, len(want) + 1))
    for g, w in zip(got, want, strict=False):
        assert (g["loss"], g["grad_norm"], g["samples_consumed"], g["epoch"]) == (
            w["loss"],
            w["grad_norm"],
            w["samples_consumed"],
            w["epoch"],
        ), f"step {g['step']}"
    a, b = load_file(run / "hf" / "model.safetensors"), load_file(baseline / "hf" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].equal(b[k]), k
