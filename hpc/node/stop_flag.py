"""Stop together at a step boundary when Slurm says the job must end.

Slurm sends the pre-stop signal (``HPC_STOP_SIGNAL``, SIGUSR2 by default) to every
rank before the time limit or on preemption, and SIGTERM when it ends the job.
Each rank only records the signal; after every step all ranks take the MAX of their
flags over a gloo group of their own (a host-side collective: it never waits for the
GPU), so they stop after the same step, save one checkpoint together and exit with
`hpc.node.contract.EXIT_STOPPED`. A notice that reached the rank before it caught the
signals is not lost: ``hpc.node.launch`` leaves it in the notice file (``HPC_STOP_NOTICE``).
Used by ``python -m train`` (installed first thing, before the heavy imports, because
Slurm may send the pre-stop signal up to a minute early) and by `hpc.integrations`.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import time
from pathlib import Path

from hpc.node.cli import HpcError
from hpc.node.contract import DIST_TIMEOUT_VAR, EXIT_STOPPED, STOP_CAUGHT_SUFFIX, STOP_NOTICE_VAR, stop_signals
from hpc.node.files import read_small_text


class StopBeforeStart(HpcError):
    """SIGTERM reached a program that cannot act on a stop yet (still starting): it ends the start (exit 75, nothing
    was trained since the last checkpoint), wherever the start was, even blocked in a system call."""

    code = EXIT_STOPPED


class StopFlag:
    """Records stop signals on this rank; `agreed()` is the collective decision. With ``ends_start`` a SIGTERM that
    comes before `join` (the program cannot stop at a step boundary yet) raises StopBeforeStart where the program is,
    so a start that blocks never outlives the job's end; the pre-stop signal is only recorded, as later."""

    def __init__(self, environ=os.environ, ends_start: bool = False):
        self.received: str | None = None
        self._starting = ends_start
        self.group = None
        self.nodes: list[str] = []  # each rank's node, by rank, when a failed agreement names the missing (join_all)
        self._agreed_at = time.monotonic()
        self._notice = environ.get(STOP_NOTICE_VAR)
        self._signals = stop_signals(environ)
        for sig in self._signals:
            signal.signal(sig, self._on_signal)
        if self._notice:  # tell hpc.node.launch that this program acts on the notice
            Path(self._notice + STOP_CAUGHT_SUFFIX).touch()

    def _on_signal(self, signum: int, frame) -> None:
        self._record(signal.Signals(signum).name)
        if self._starting and signum == signal.SIGTERM:
            self._starting = False
            raise StopBeforeStart(
                f"got SIGTERM while starting, before any step: stopped with nothing to save (exit {EXIT_STOPPED})"
            )

    def _record(self, name: str) -> None:
        if self.received is None:
            self.received = name
            print(
                f"[preempt] rank {os.environ.get('RANK', '?')} got {name}: stopping at the next step boundary",
                flush=True,
            )

    def noticed(self) -> bool:
        """Whether this rank got a stop signal, caught here or left in the notice file by ``hpc.node.launch``."""
        if self.received is None and self._notice and os.path.exists(self._notice):
            try:
                name = read_small_text(self._notice).strip()
            except (
                OSError,
                ValueError,
            ):  # hpc.node.launch writes a signal's name; anything else there is a notice all the same
                name = ""
            self._record(name or "a stop notice")
        return self.received is not None

    def join(self, group) -> None:
        """The (gloo) process group that `agreed` reduces over; released at interpreter exit. From now on a SIGTERM is
        acted on at the next step boundary."""
        self._starting = False
        self.group = group
        atexit.register(self._release_group)

    def join_all(self, environ=os.environ) -> None:
        """For users' scripts: a gloo group of all ranks (timeout ``HPC_DIST_TIMEOUT_S`` where hpc.node.launch set it)
        to agree over, and each rank's node, so that an agreement that times out names the ranks that did not arrive
        and marks their nodes bad (collective: every rank calls it at the same point)."""
        from datetime import timedelta

        import torch.distributed as dist

        from hpc.node.hang import gather_nodes
        from hpc.node.netcheck import dist_timeout_s

        timeout = timedelta(seconds=dist_timeout_s(environ)) if DIST_TIMEOUT_VAR in environ else None
        self.join(dist.new_group(backend="gloo", timeout=timeout))  # host-side: never waits for the GPU
        self.nodes = gather_nodes(self.group)

    def _release_group(self) -> None:
        """At exit, while Python is still whole: destroy this flag's group and give the gloo worker threads of
        groups other objects still hold (DDP's) a moment to let go of their last finished collective. A worker
        that does so once finalization has begun needs the GIL it can no longer take, and torch aborts the
        process ("terminate called without an active exception": exit 134 where the script exited 0 or 75)."""
        import torch.distributed as dist

        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group(self.group)  # local for gloo: joins its threads once unreferenced
        self.group = None
        gc.collect()
        time.sleep(0.2)

    def ignore_further(self) -> None:
        """Ignore stop signals from now on: the run has decided (a late notice during
        interpreter shutdown would otherwise kill the process with the default action)."""
        self._starting = False
        for sig in self._signals:
            signal.signal(sig, signal.SIG_IGN)

    def agreed(self, step: int | None = None) -> bool:
        """True on every rank when any rank got a stop signal (one tiny host-side all_reduce; none on a single
        process outside a process group). After ``join_all``, an agreement that times out or fails as a peer's
        process ended first names the missing ranks (`hpc.node.hang`), then raises."""
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return self.noticed()
        flag = torch.tensor([int(self.noticed())])
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        except (RuntimeError, dist.DistError) as e:
            from hpc.node.hang import collective_failure, name_the_missing

            failure = collective_failure(e) if self.nodes else None
            if failure is not None:
                where = f"after step {step}" if step is not None else "at the stop agreement"
                name_the_missing(
                    where, time.monotonic() - self._agreed_at, dist.get_rank(), self.nodes, failure, step=step
                )
            raise
        self._agreed_at = time.monotonic()
        return bool(flag.item())
