"""Stop-and-requeue on the nodes: which signals mean "stop", and asking Slurm to requeue the job.

The sbatch preamble exports HPC_STOP_SIGNAL (the pre-stop signal Slurm sends every
rank before the time limit or on preemption) and HPC_MAX_REQUEUES. A rank
program catches `stop_signals()`, saves at a step boundary together with the
other ranks, lets one rank call `requeue()`, and exits with `REQUEUE_EXIT` so
launchers know the job is coming back rather than finished or failed.
"""
from __future__ import annotations

import signal
import subprocess
from typing import Mapping

REQUEUE_EXIT = 75  # EX_TEMPFAIL: stopped cleanly, will run again


class RequeueRefused(RuntimeError):
    """The job stopped but will not come back; the message says why."""


def prestop_signal(environ: Mapping[str, str]) -> signal.Signals:
    """The profile's pre-stop signal (default SIGUSR2)."""
    name = environ.get("HPC_STOP_SIGNAL", "USR2").upper().removeprefix("SIG")
    return signal.Signals[f"SIG{name}"]


def stop_signals(environ: Mapping[str, str]) -> list[signal.Signals]:
    """The pre-stop signal and SIGTERM."""
    return sorted({prestop_signal(environ), signal.SIGTERM})


def ignore_prestop(environ: Mapping[str, str]) -> None:
    """Ignore the pre-stop signal in this process and the programs it starts (until they catch it).

    An ignored signal stays ignored across exec, so a rank program that is still
    starting up is not killed by an early notice, and one that never asks for it
    runs on; SIGTERM keeps its default.
    """
    sig = prestop_signal(environ)
    if sig != signal.SIGTERM:
        signal.signal(sig, signal.SIG_IGN)


def requeue(environ: Mapping[str, str]) -> str:
    """`scontrol requeue` this job unless it already used its requeues; returns what was done."""
    job = environ.get("SLURM_JOB_ID")
    if not job:
        raise RequeueRefused("not a Slurm job (no SLURM_JOB_ID): nothing to requeue")
    restarts = int(environ.get("SLURM_RESTART_COUNT") or 0)
    limit = int(environ.get("HPC_MAX_REQUEUES", "5"))
    if restarts >= limit:
        raise RequeueRefused(f"job {job} already restarted {restarts} times (max requeues {limit}): not requeued")
    r = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if r.returncode != 0:
        raise RequeueRefused(f"scontrol requeue {job} failed: {r.stderr.strip() or r.stdout.strip()}")
    return f"requeued job {job} (restart {restarts + 1} of at most {limit})"
