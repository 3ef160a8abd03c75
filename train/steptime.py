"""Compute or network? One step's wall time split into computation and time spent waiting.

Every ``log.log_every`` steps the trainer times one step this way (rank 0 logs it):

* GPU: the step runs under ``torch.profiler``; ``compute_s`` is the time the device ran
  any kernel other than communication (the union of their intervals) and ``wait_s`` the
  rest of the step: communication not hidden behind compute, plus host stalls.
* CPU: ``compute_s`` is the CPU time of this thread (intra-op threads off, as in the
  jobs' OMP_NUM_THREADS=1) and ``wait_s`` the rest: blocked in collectives, or not
  scheduled on an oversubscribed node.

A step that is mostly ``wait_s`` is bound by the network (or a straggler), not by compute.

Which rank the others wait for is a separate question: ``CollectiveWait`` measures, on every rank and every step, the
time its training thread spends inside torch.distributed's collectives (blocked until the last rank arrives), so
the rank that arrives last, whatever delayed it, waits least (train/straggler.py).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")
COMM_KERNEL = re.compile(r"nccl|allreduce|all_reduce|allgather|all_gather|reducescatter|reduce_scatter|sendrecv", re.I)


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def timed_step(step: Callable[[], T], device: torch.device) -> tuple[T, dict]:
    """Run `step` once and return its result with {"compute_s", "wait_s"}."""
    if device.type != "cuda":
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        out = step()
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
        return out, {"compute_s": min(cpu, wall), "wait_s": max(0.0, wall - cpu)}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall0 = time.perf_counter()
        out = step()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - wall0
    kernels = [
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not COMM_KERNEL.search(e.name)
    ]
    compute = min(wall, busy_seconds(kernels) / 1e6)
    return out, {"compute_s": compute, "wait_s": wall - compute}


# The files of torch.distributed whose functions block in a collective: the process-group calls (and their waits),
# the functional collectives' waits (tensor parallelism) and FSDP2's waits on its all-gathers.
COLLECTIVE_FILES = ("distributed_c10d.py", "_functional_collectives.py", "_fsdp_collectives.py")


def in_collective(frame) -> bool:
    """Whether the innermost Python frame of a thread is a torch.distributed collective (or a wait on one)."""
    name = frame.f_code.co_filename
    return "distributed" in name and name.endswith(COLLECTIVE_FILES)


class CollectiveWait:
    """How long the thread that creates it spends inside collectives while ``resume``d (a step): a sampler thread looks
    every ``period_s`` at that thread's innermost frame (`in_collective`), and sleeps without waking while paused. A gap
    between two looks longer than two periods (the whole process stopped or not scheduled) counts as not waiting: the
    others wait for such a rank, not it for them. ``take()`` returns the seconds counted since the last call;
    ``cpu_s`` is the sampler's own CPU time."""

    def __init__(self, period_s: float = 0.02):
        self.period_s = period_s
        self._watched = threading.get_ident()
        self._waited = 0.0
        self._lock = threading.Lock()
        self._on = threading.Event()
        self._since = time.perf_counter()
        self._stopped = False
        self.cpu_s = 0.0
        self._thread = threading.Thread(target=self._run, name="hpc-collective-wait", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        while True:
            self._on.wait()
            if self._stopped:
                return
            last = self._since
            while self._on.is_set() and not self._stopped:
                time.sleep(self.period_s)  # a sleep wakes at half the CPU cost of an Event's timed wait
                now = time.perf_counter()
                dt, last = now - last, now
                frame = sys._current_frames().get(self._watched)
                if frame is not None and in_collective(frame) and self._on.is_set():
                    with self._lock:
                        self._waited += min(dt, 2 * self.period_s)
                del frame
            self.cpu_s = time.thread_time() - cpu0

    def resume(self) -> None:
        """Count from now (a step starts)."""
        self._since = time.perf_counter()
        self._on.set()

    def pause(self) -> None:
        """Stop counting (the step ended): the sampler sleeps until the next ``resume``."""
        self._on.clear()

    def take(self) -> float:
        with self._lock:
            waited, self._waited = self._waited, 0.0
        return waited

    def close(self) -> None:
        self._stopped = True
        self._on.set()
        self._thread.join()
