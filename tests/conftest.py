"""Shared by the tiers: the project's paths, a command line run as a user would, and waiting for a Slurm job."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python ARGS` as a user would, capturing text output."""
    return subprocess.run([PYTHON, *args], cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def wait_job(job_id: str, timeout: float = 300) -> str:
    """Block until Slurm reports a final state for the job; returns it."""
    from hpc.node.contract import ENDED_STATES
    from hpc.login.slurm_query import job_state

    deadline = time.time() + timeout
    while time.time() < deadline:
        state = job_state(job_id)
        if state in ENDED_STATES:
            return state
        time.sleep(1)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s")


GOLDEN = ROOT / "tests" / "golden"
GOLDEN_WORKDIR, GOLDEN_PYTHON = "/home/alice/project", "/opt/venv/bin/python"


def assert_golden(name: str, script: str, workdir: Path) -> None:
    """``script`` (rendered or submitted from ``workdir``) equals tests/golden/NAME.sbatch, with the machine's paths
    written as a fixed workdir, python and {PROJECT}; UPDATE_GOLDEN=1 writes the file instead."""
    text = (script.replace(str(workdir.resolve()), GOLDEN_WORKDIR).replace(PYTHON, GOLDEN_PYTHON)
            .replace(str(ROOT), "{PROJECT}"))
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; review the change and refresh it with UPDATE_GOLDEN=1"


def job_nodes(job_id: str) -> list[str]:
    """The nodes Slurm gave the job, in order (other jobs may hold any node, so tests never assume n1, n2)."""
    import hostlist

    from hpc.login.slurm_query import scontrol_fields

    return hostlist.expand_hostlist(scontrol_fields(job_id)["NodeList"])
