"""Shared fixtures: the project's paths, the tiny environment, and the local Slurm cluster."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python ARGS` as a user would, capturing text output."""
    return subprocess.run([PYTHON, *args], cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def slurm() -> dict[str, str]:
    """The local cluster (scripts/cluster.sh up), shared by the whole test session."""
    import yaml

    conf = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())["submission"]["slurm_conf"]
    os.environ["SLURM_CONF"] = conf
    if shutil.which("sbatch") is None or not Path(conf).is_file():
        pytest.fail("the local Slurm cluster is not up: run `bash scripts/cluster.sh up` (scripts/test.sh does)")
    r = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"sinfo failed ({r.stderr.strip()}): start the cluster with `bash scripts/cluster.sh up`")
    return {"SLURM_CONF": conf}


def wait_job(job_id: str, timeout: float = 300) -> str:
    """Block until Slurm reports a final state for the job; returns it."""
    import time

    from hpc.node.contract import ENDED_STATES
    from hpc.slurm_query import job_state

    deadline = time.time() + timeout
    while time.time() < deadline:
        state = job_state(job_id)
        if state in ENDED_STATES:
            return state
        time.sleep(1)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s")
