"""Compute or network? One step's wall time split into computation and time spent waiting.

Every ``log.log_every`` steps the trainer times one step this way (rank 0 logs it):

* GPU: the step runs under ``torch.profiler``; ``compute_s`` is the time the device ran
  any kernel other than communication (the union of their intervals) and ``wait_s`` the
  rest of the step: communication not hidden behind compute, plus host stalls.
* CPU: ``compute_s`` is the CPU time of this thread (intra-op threads off, as in the
  jobs' OMP_NUM_THREADS=1) and ``wait_s`` the rest: blocked in collectives, or not
  scheduled on an oversubscribed node.

A step that is mostly ``wait_s`` is bound by the network (or a straggler), not by compute.
"""
from __future__ import annotations

import re
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
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and not COMM_KERNEL.search(e.name)]
    compute = min(wall, busy_seconds(kernels) / 1e6)
    return out, {"compute_s": compute, "wait_s": wall - compute}
