"""The stop-and-requeue contract between Slurm, the batch script and the rank programs.

Exit codes of a rank program (the trainer, or a script of yours):

    ===  ==========================================================================
     0   done: the run reached its end (also a run started at or past its end)
     1   failed: an error in the run; never requeued
     2   bad input: config, data or wiring; one line on stderr; never requeued
    75   stopped by a notice: a checkpoint of the stop step is saved; requeue me
    ===  ==========================================================================

Slurm sends the pre-stop signal (``HPC_STOP_SIGNAL``) to every process of the job step
before the time limit or on preemption, and SIGTERM when it ends the job. A rank program
catches `stop_signals()`, saves at a step boundary together with the other ranks and
exits `EXIT_STOPPED`. ``hpc.launch``, which runs each rank program as its child, turns
that exit into 0 (so neither ``srun --kill-on-bad-exit`` nor torchrun nor accelerate
takes a clean stop for a failure) and leaves a stop record at ``$HPC_STOP_RECORD``.
After the step, the batch script, outside the ranks and any container, requeues the
job when the record is there and the job has requeues left (``HPC_MAX_REQUEUES``).
"""
from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Mapping

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped cleanly, will run again

# Environment variables that the batch script exports for the nodes.
STOP_SIGNAL_VAR = "HPC_STOP_SIGNAL"
MAX_REQUEUES_VAR = "HPC_MAX_REQUEUES"
STOP_RECORD_VAR = "HPC_STOP_RECORD"
JOB_NAME_VAR = "HPC_JOB_NAME"
JOB_DIR_VAR = "HPC_JOB_DIR"

DEFAULT_STOP_SIGNAL = "USR2"  # NCCL may use USR1
DEFAULT_MAX_REQUEUES = 5
STOP_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG")


def prestop_signal(environ: Mapping[str, str]) -> signal.Signals:
    """The profile's pre-stop signal (default SIGUSR2)."""
    name = environ.get(STOP_SIGNAL_VAR, DEFAULT_STOP_SIGNAL).upper().removeprefix("SIG")
    return signal.Signals[f"SIG{name}"]


def stop_signals(environ: Mapping[str, str]) -> list[signal.Signals]:
    """The pre-stop signal and SIGTERM."""
    return sorted({prestop_signal(environ), signal.SIGTERM})


def shield_from_stop(environ: Mapping[str, str]) -> None:
    """Keep this supervising process alive through stop signals while its child saves.

    The pre-stop signal is ignored, and an ignored signal stays ignored across exec, so a
    rank program still starting up is not killed by an early notice (it catches the signal
    once it can act on it). SIGTERM gets a handler that does nothing; a handler is reset to
    the default in the child, so SIGTERM still ends a rank program that does not catch it.
    """
    sig = prestop_signal(environ)
    if sig != signal.SIGTERM:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)


def record_stop(environ: Mapping[str, str], note: str) -> Path | None:
    """Leave the stop record the batch script looks for after the step (None outside such a job)."""
    path = environ.get(STOP_RECORD_VAR)
    if not path:
        return None
    Path(path).write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {note}\n")
    return Path(path)

