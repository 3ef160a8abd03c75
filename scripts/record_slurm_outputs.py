"""Record real squeue, sacct and scontrol outputs of small jobs on the local cluster, in the formats hpc.slurm_query
asks for, as fixtures for the unit tests: python scripts/record_slurm_outputs.py [--out tests/unit/data/slurm].

Each case is one job brought to one state (pending, running, completed, failed, cancelled, requeued twice, timed out);
for each, CASE.scontrol, CASE.sacct and CASE.squeue hold the commands' stdout, and cases.json what the job was made to
be.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hpc.node.contract import ENDED_STATES
from hpc.site import load_site
from hpc.slurm_query import parse_sacct, parse_scontrol, sacct_command, scontrol_command, squeue_command

ROOT = Path(__file__).resolve().parent.parent

NAME = "record slurm|outputs = x"  # spaces, sacct's usual delimiter and " Key=" look-alikes: parsed as one name


def run(argv: list[str]) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        sys.exit(f"record_slurm_outputs: {' '.join(argv)} failed: {r.stderr.strip()}")
    return r.stdout


def sbatch(work: Path, *flags: str, wrap: str) -> str:
    return (
        run(
            [
                "sbatch",
                "--parsable",
                "-J",
                NAME,
                "-N",
                "1",
                "-n",
                "1",
                "-o",
                str(work / "%j.out"),
                *flags,
                "--wrap",
                wrap,
            ]
        )
        .strip()
        .split(";")[0]
    )


def fields(job: str) -> dict[str, str]:
    return parse_scontrol(run(scontrol_command(job)))


def wait(job: str, done, what: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not done(fields(job)):
        if time.time() > deadline:
            sys.exit(f"record_slurm_outputs: job {job} did not reach {what} in {timeout} s")
        time.sleep(1)


def state_is(*states: str):
    return lambda f: f.get("JobState") in states


def sacct_settled(job: str, state: str, runs: int, timeout: float = 60) -> None:
    """Accounting lags behind slurmctld (a new job is first an "allocation" there): wait until it shows the job's
    name, runs and final state. Live jobs are recorded as accounting has them at the time."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = parse_sacct(run(sacct_command("-j", job)))
        if len(rows) == runs and rows[-1]["State"].startswith(state) and all(r["JobName"] == NAME for r in rows):
            return
        time.sleep(1)
    sys.exit(f"record_slurm_outputs: sacct did not show job {job} {state} in {runs} run(s) within {timeout} s")


def record(out: Path, case: str, job: str, expect: dict, cases: dict) -> None:
    (out / f"{case}.scontrol").write_text(run(scontrol_command(job)))
    (out / f"{case}.sacct").write_text(run(sacct_command("-j", job)))
    (out / f"{case}.squeue").write_text(run(squeue_command("-j", job)) if expect["state"] not in ENDED_STATES else "")
    cases[case] = {"job_id": job, "name": NAME, "nodes": 1, **expect}
    print(f"[record] {case}: job {job} {expect['state']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "unit" / "data" / "slurm")
    out = ap.parse_args().out
    os.environ["SLURM_CONF"] = load_site("local").submission.slurm_conf
    out.mkdir(parents=True, exist_ok=True)
    cases: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="record-slurm-") as tmp:
        work = Path(tmp)
        held = sbatch(work, "--hold", wrap="true")
        running = sbatch(work, wrap="sleep 300")
        completed = sbatch(work, wrap="echo done")
        failed = sbatch(work, wrap="exit 3")
        requeued = sbatch(work, "--requeue", wrap="sleep 15")
        timeout = sbatch(work, "--time=1", wrap="sleep 600")

        wait(held, state_is("PENDING"), "PENDING")
        record(out, "pending", held, {"state": "PENDING", "restarts": 0}, cases)
        run(["scancel", held])

        wait(running, state_is("RUNNING"), "RUNNING")
        record(out, "running", running, {"state": "RUNNING", "restarts": 0}, cases)
        run(["scancel", running])
        wait(running, state_is("CANCELLED"), "CANCELLED")
        sacct_settled(running, "CANCELLED", 1)
        record(out, "cancelled", running, {"state": "CANCELLED", "restarts": 0}, cases)

        for job, state, case in ((completed, "COMPLETED", "completed"), (failed, "FAILED", "failed")):
            wait(job, state_is(state), state)
            sacct_settled(job, state, 1)
            record(
                out,
                case,
                job,
                {"state": state, "restarts": 0, "exit_code": "0:0" if state == "COMPLETED" else "3:0"},
                cases,
            )

        for restart in (1, 2):
            wait(
                requeued,
                lambda f, restart=restart: f.get("JobState") == "RUNNING" and int(f["Restarts"]) == restart - 1,
                f"run {restart}",
            )
            run(["scontrol", "requeue", requeued])
        wait(
            requeued, lambda f: f.get("JobState") == "PENDING" and f.get("Restarts") == "2", "PENDING after 2 requeues"
        )
        record(out, "requeued_pending", requeued, {"state": "PENDING", "restarts": 2}, cases)
        wait(requeued, state_is("COMPLETED"), "COMPLETED after its requeues", timeout=400)
        sacct_settled(requeued, "COMPLETED", 3)
        record(out, "requeued_completed", requeued, {"state": "COMPLETED", "restarts": 2}, cases)

        wait(timeout, state_is("TIMEOUT"), "TIMEOUT", timeout=400)
        sacct_settled(timeout, "TIMEOUT", 1)
        record(out, "timeout", timeout, {"state": "TIMEOUT", "restarts": 0}, cases)
    (out / "cases.json").write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
