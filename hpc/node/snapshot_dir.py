"""Where a job run's memory snapshots (the trainer's ``checkpoint.memory_every``, train/snapshot.py) live on a node:
``$HPC_SNAPSHOT_DIR/<job id>.<run>/<node>/`` (tmpfs by default); the trainer writes them, each node's standby
(`hpc.node.standby`) removes its node's at the run's end."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from hpc.node.contract import SNAPSHOT_DIR_DEFAULT, SNAPSHOT_DIR_VAR

_JOB_ID = re.compile(r"[0-9]{1,10}(_[0-9]{1,10})?")
_RUN = re.compile(r"[0-9]{1,6}")


def job_key(environ: Mapping[str, str]) -> str | None:
    """``<job id>.<run>``: the Slurm job (array task) and its run (SLURM_RESTART_COUNT: a requeue is a new run), the
    one name under which this job's snapshots live; None outside a Slurm job or for values that are no ids."""
    job = environ.get("SLURM_JOB_ID") or ""
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    run = environ.get("SLURM_RESTART_COUNT") or "0"
    if not _JOB_ID.fullmatch(job) or not _RUN.fullmatch(run):
        return None
    return f"{job}.{run}"


def job_dir(environ: Mapping[str, str]) -> Path | None:
    """This job run's snapshot directory (every node keeps its copies in ``<it>/<node name>/``); None outside Slurm."""
    key = job_key(environ)
    return None if key is None else Path(environ.get(SNAPSHOT_DIR_VAR) or SNAPSHOT_DIR_DEFAULT) / key
