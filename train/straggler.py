"""Which rank is slow? Straggler naming from compute-only time, exchanged every few steps.

Under data parallelism a slow rank makes every rank's step slow: the others wait for it in the
collectives. Only the time a rank computes, without waiting, tells it apart (train/steptime.py):

* CPU: the thread time of every step (a blocked collective uses none);
* GPU: the kernel time outside communication of the steps profiled for the log lines (one per
  ``log.log_every``), so a window spans at least one of them.

Every window (``straggler.every`` steps) the ranks all-gather their median compute time per step
over a gloo group (no device sync). A rank slower than the median of the others by more than
``straggler.threshold`` in ``straggler.windows`` windows in a row is named with its node, on rank
0's output and in that step's metrics record (``stragglers``), for as long as it stays slow.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from train.config import StragglerConfig

T = TypeVar("T")


def burn_cpu(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time (a slower processor, as the test-only setting has it)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def slower_than_peers(times: list[float]) -> list[float]:
    """Each rank's compute time over the median of the other ranks', minus 1 (0.14: 14% slower)."""
    return [m / max(statistics.median(times[:r] + times[r + 1:]), 1e-12) - 1 for r, m in enumerate(times)]


class Streaks:
    """Consecutive slow windows per rank; the ranks slow for at least ``windows`` windows in a row are named."""

    def __init__(self, world: int, threshold: float, windows: int):
        self.threshold, self.windows = threshold, windows
        self.slow: list[list[float]] = [[] for _ in range(world)]

    def add(self, slower: list[float]) -> list[tuple[int, float, int]]:
        """One window's ``slower_than_peers``; returns (rank, mean excess over its streak, streak length) of the named."""
        for r, s in enumerate(slower):
            self.slow[r] = self.slow[r] + [s] if s > self.threshold else []
        return [(r, statistics.fmean(s), len(s)) for r, s in enumerate(self.slow) if len(s) >= self.windows]


class StragglerMonitor:
    """Measures this rank's compute time per step and, every window, names the stragglers (collective over all ranks)."""

    def __init__(self, cfg: StragglerConfig, rank: int, device: torch.device, log_every: int, nodes: list[str]):
        self.cfg, self.rank, self.device, self.nodes = cfg, rank, device, nodes
        world = dist.get_world_size()  # the test ranks are ranks of it: train.run_check
        self.persistent: list[dict] = []  # named stragglers that stop the run (straggler.stop_after)
        self.enabled = cfg.every > 0 and world > 1
        if not self.enabled:
            return
        on_gpu = device.type == "cuda"
        self.window = -(-cfg.every // log_every) * log_every if on_gpu else cfg.every  # GPU: whole log_every periods
        self.group = dist.new_group(backend="gloo")
        self.streaks = Streaks(world, cfg.threshold, cfg.windows)
        self.slow_here = cfg.test_slow_s if cfg.test_slow_rank == rank else 0.0
        self._times: list[float] = []
        self.overhead_s = 0.0  # this monitor's own time on this rank (metrics: straggler_overhead_s, at each window)

    def measured(self, step: Callable[[], T]) -> Callable[[], T]:
        """``step`` timed by thread time on CPU (and slowed on the test-only slow rank)."""
        if not self.enabled:
            return step

        def run() -> T:
            t0 = time.thread_time()
            out = step()
            if self.slow_here:
                if self.device.type == "cuda":
                    torch.cuda._sleep(int(self.slow_here * 1.4e9))  # a kernel of about that many seconds at 1.4 GHz
                else:
                    burn_cpu(self.slow_here)
            t1 = time.perf_counter()
            if self.device.type != "cuda":
                self._times.append(time.thread_time() - t0)
            self.overhead_s += time.perf_counter() - t1
            return out

        return run

    def after_step(self, step: int, record: dict) -> None:
        """Keep a profiled GPU step's compute time; at the end of a window exchange, judge and name (into ``record``)."""
        if not self.enabled:
            return
        if self.device.type == "cuda" and "compute_s" in record:
            self._times.append(record["compute_s"])
        if step % self.window:
            return
        t0 = time.perf_counter()
        try:
            self._exchange(step, record)
        finally:
            self.overhead_s += time.perf_counter() - t0
            record["straggler_overhead_s"] = self.overhead_s

    def _exchange(self, step: int, record: dict) -> None:
        mine = torch.tensor([statistics.median(self._times) if self._times else 0.0, float(len(self._times))], dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in self.nodes]
        dist.all_gather(every, mine, group=self.group)
        self._times = []
        if any(t[1] == 0 for t in every):
            return
        times = [t[0].item() for t in every]
        named = self.streaks.add(slower_than_peers(times))
        if not named:
            return
        found = [{"rank": r, "node": self.nodes[r], "slower": round(excess, 4), "windows": n,
                  "compute_s": times[r], "others_median_s": statistics.median(times[:r] + times[r + 1:])}
                 for r, excess, n in named]
        record["stragglers"] = found
        if self.cfg.stop_after:
            self.persistent = [f for f in found if f["windows"] >= self.cfg.stop_after]
        if self.rank == 0:
            for f in found:
                print(f"[straggler] step {step}: {describe(f)} (compute {f['compute_s']:.4f} s per step, "
                      f"others' median {f['others_median_s']:.4f} s)", flush=True)


def describe(f: dict) -> str:
    """'rank 3 on n2, 14% slower than the median over 3 windows'."""
    return f"rank {f['rank']} on {f['node']}, {100 * f['slower']:.0f}% slower than the median over {f['windows']} windows"
