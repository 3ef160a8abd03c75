"""Faults a test injects into the trainer's ranks (tests only), for the in-job restart's fault catalogue:

    HPC_TEST_FAULTS="KIND@RANK:STEP[:ATTEMPT],..."

fires KIND on rank RANK right after step STEP in the job's first run (``SLURM_RESTART_COUNT`` 0) and its in-job
attempt ATTEMPT (``HPC_ATTEMPT``, default 0), so a restarted run passing that step again goes on:

* ``exception``: a RuntimeError raised in the step loop (an error in the program);
* ``exit``: ``sys.exit(1)``;
* ``no-restart``: ``sys.exit(93)``, the contract's "do not restart or requeue";
* ``segfault``: a read of address 0 (SIGSEGV);
* ``gil``: a C call that sleeps an hour holding the GIL (the process answers nothing, signals included, but SIGKILL);
* the exceptions PyTorch raises for a GPU's or NCCL's error, built as torch builds them (`hpc.node.fault_table` judges
  them): ``ecc`` (``torch.AcceleratorError``, CUDA error 214), ``launch-failure`` (719), ``device-assert`` (710),
  ``oom`` (``torch.OutOfMemoryError``), ``nccl-system`` (``torch.distributed.DistBackendError``, ncclSystemError);
* ``slow-save``: the checkpoint save of step STEP (a save step) takes ``SLOW_SAVE_S`` longer on that rank.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Mapping

from hpc.node.cli import HpcError, shown
from hpc.node.contract import ATTEMPT_VAR, EXIT_NO_RESTART, TEST_FAULTS_VAR

CUDA_ERRORS = {  # kind: (cudaError_t, the text torch gives it)
    "ecc": (214, "uncorrectable ECC error encountered"),
    "launch-failure": (719, "unspecified launch failure"),
    "device-assert": (710, "device-side assert triggered"),
}
SLOW_SAVE = "slow-save"
SLOW_SAVE_S = 90.0
KINDS = ("exception", "exit", "no-restart", "segfault", "gil", *CUDA_ERRORS, "oom", "nccl-system", SLOW_SAVE)


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    attempt: int = 0


def parse(text: str) -> list[Fault]:
    """``KIND@RANK:STEP[:ATTEMPT]`` items, comma-separated; an HpcError naming the variable otherwise."""
    faults = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"([a-z-]+)@([0-9]{1,6}):([0-9]{1,9})(?::([0-9]{1,6}))?", item)
        if not m or m.group(1) not in KINDS:
            raise HpcError(
                f"{TEST_FAULTS_VAR}={shown(text)}: {shown(item)} is not KIND@RANK:STEP[:ATTEMPT] with KIND one of "
                f"{', '.join(KINDS)}"
            )
        faults.append(Fault(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4) or 0)))
    return faults


def planned(rank: int, environ: Mapping[str, str] = os.environ) -> dict[int, Fault]:
    """This rank's faults in this run and attempt, by step."""
    if environ.get("SLURM_RESTART_COUNT", "0") != "0":
        return {}
    attempt = int(environ.get(ATTEMPT_VAR, "0") or 0)
    return {f.step: f for f in parse(environ.get(TEST_FAULTS_VAR, "")) if f.rank == rank and f.attempt == attempt}


def fire(fault: Fault, where: str) -> None:
    """Inject ``fault`` now (``where``: this rank and node, for the log line before it)."""
    print(
        f"[fault] {where} (pid {os.getpid()}) at {time.time():.3f}: {TEST_FAULTS_VAR}: {fault.kind} after step "
        f"{fault.step}",
        flush=True,
    )
    if fault.kind == "exception":
        raise RuntimeError(f"injected fault after step {fault.step}")
    if fault.kind in ("exit", "no-restart"):
        sys.exit(1 if fault.kind == "exit" else EXIT_NO_RESTART)
    if fault.kind == SLOW_SAVE:
        time.sleep(SLOW_SAVE_S)
        return
    if fault.kind in (*CUDA_ERRORS, "oom", "nccl-system"):
        raise torch_error(fault.kind)
    if fault.kind == "segfault":
        ctypes.string_at(0)
    ctypes.PyDLL(None).sleep(3600)  # "gil": a PyDLL call keeps the GIL


def torch_error(kind: str) -> BaseException:
    """The exception PyTorch raises for ``kind``, with the code torch gives it (AcceleratorError's ``error_code``; an
    NCCL error's result name in its text)."""
    import torch
    import torch.distributed as dist

    if kind in CUDA_ERRORS:
        code, text = CUDA_ERRORS[kind]
        exc = torch.AcceleratorError(f"CUDA error: {text}\nSearch for `{code}' in the CUDA documentation")
        exc.error_code = code
        return exc
    if kind == "oom":
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return dist.DistBackendError(
        "NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), "
        "NCCL version 2.27.3\nncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error.\nLast error:\nsocket recv: Connection reset by peer"
    )
