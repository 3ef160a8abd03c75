"""Which rank is slow? The rank the others wait for, named with the cause, exchanged every few steps.

Under data parallelism a slow rank makes every rank's step slow: the others wait for it in the
collectives. Two measures per rank tell it apart (train/steptime.py):

* busy time: a step's wall time less the time the rank spent in it inside collectives waiting for the
  others (`CollectiveWait`, every step). The rank that arrives last waits least, whatever delayed it: its
  computation, or the host (the process stopped or descheduled, a starved data loader, page faults, slow
  storage). What happens between steps (rank 0's metrics and logs, checkpoint saves) is left out: all
  ranks wait for rank 0 there, every step, and that is no straggler. On GPU this is the host's side;
* compute time: CPU: the thread time of every step (a blocked or stopped thread uses none); GPU: the
  kernel time outside communication of the steps profiled for the log lines (one per ``log.log_every``),
  so a window spans at least one of them. It names a slow device the host does not see, and says why a
  rank is late: its computation is slower ("compute"), or not ("host").

Every window (``straggler.every`` steps) the ranks all-gather their mean busy and median compute time
per step over a gloo group (no device sync). A rank slower than the median of the others, by either measure,
by more than ``straggler.threshold`` in ``straggler.windows`` windows in a row is named with its node and
the cause, on rank 0's output and in that step's metrics record (``stragglers``), for as long as it stays
slow.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from train.front.config import StragglerConfig
from train.steptime import CollectiveWait

T = TypeVar("T")


def burn_cpu(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time (a slower processor, as the test-only setting has it)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def slower_than_peers(times: list[float]) -> list[float]:
    """Each rank's compute time over the median of the other ranks', minus 1 (0.14: 14% slower)."""
    return [m / max(statistics.median(times[:r] + times[r + 1 :]), 1e-12) - 1 for r, m in enumerate(times)]


class Streaks:
    """Consecutive slow windows per rank; the ranks slow for at least ``windows`` windows in a row are named."""

    def __init__(self, world: int, threshold: float, windows: int):
        self.threshold, self.windows = threshold, windows
        self.slow: list[list[float]] = [[] for _ in range(world)]

    def add(self, slower: list[float]) -> list[tuple[int, float, int]]:
        """One window's ``slower_than_peers``; returns (rank, mean excess over its streak, streak length) of the
        named."""
        for r, s in enumerate(slower):
            self.slow[r] = self.slow[r] + [s] if s > self.threshold else []
        return [(r, statistics.fmean(s), len(s)) for r, s in enumerate(self.slow) if len(s) >= self.windows]


class StragglerMonitor:
    """Measures this rank's busy and compute time per step and, every window, names the stragglers (collective over all
    ranks)."""

    def __init__(self, cfg: StragglerConfig, rank: int, device: torch.device, log_every: int, nodes: list[str]):
        self.cfg, self.rank, self.device, self.nodes = cfg, rank, device, nodes
        world = dist.get_world_size()  # the test ranks are ranks of it: train.front.run_check
        self.persistent: list[dict] = []  # named stragglers that stop the run (straggler.stop_after)
        self.enabled = cfg.every > 0 and world > 1
        if not self.enabled:
            return
        on_gpu = device.type == "cuda"
        self.window = -(-cfg.every // log_every) * log_every if on_gpu else cfg.every  # GPU: whole log_every periods
        self.group = dist.new_group(backend="gloo")
        self.streaks = Streaks(world, cfg.threshold, cfg.windows)
        self.slow_here = cfg.test_slow_s if cfg.test_slow_rank == rank else 0.0
        self._times: list[float] = []  # compute time per step
        self._busy: list[float] = []  # busy time per step: its wall time less its waits in collectives
        self.waits = CollectiveWait()
        self._own_s = 0.0  # this monitor's own time on this rank but the sampler's

    @property
    def overhead_s(self) -> float:
        """This monitor's own time on this rank, the wait sampler's included (metrics: straggler_overhead_s)."""
        return self._own_s + self.waits.cpu_s

    def measured(self, step: Callable[[], T]) -> Callable[[], T]:
        """``step`` timed by thread time on CPU (and slowed on the test-only slow rank), and its busy time."""
        if not self.enabled:
            return step

        def run() -> T:
            start = time.perf_counter()
            self.waits.resume()  # only the step's own waits: what happens between steps is left out
            t0 = time.thread_time()
            begun = time.perf_counter()
            self._own_s += begun - start
            out = step()
            if self.slow_here:
                if self.device.type == "cuda":
                    torch.cuda._sleep(int(self.slow_here * 1.4e9))  # a kernel of about that many seconds at 1.4 GHz
                else:
                    burn_cpu(self.slow_here)
            t1 = time.perf_counter()
            self.waits.pause()
            self._busy.append(max(0.0, t1 - begun - self.waits.take()))
            if self.device.type != "cuda":
                self._times.append(time.thread_time() - t0)
            self._own_s += time.perf_counter() - t1
            return out

        return run

    def after_step(self, step: int, record: dict) -> None:
        """Keep a profiled GPU step's compute time; at the end of a window exchange, judge and name (into
        ``record``)."""
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
            self._own_s += time.perf_counter() - t0
            record["straggler_overhead_s"] = self.overhead_s

    def _exchange(self, step: int, record: dict) -> None:
        def median(values: list[float]) -> float:
            return statistics.median(values) if values else 0.0

        # compute: the median step (a step's own hiccup is no slower processor); busy: the mean, so that stalls that
        # hit a few steps of the window count in full
        mine = torch.tensor(
            [
                median(self._times),
                float(len(self._times)),
                statistics.fmean(self._busy) if self._busy else 0.0,
                float(len(self._busy)),
            ],
            dtype=torch.float64,
        )
        every = [torch.empty_like(mine) for _ in self.nodes]
        dist.all_gather(every, mine, group=self.group)
        self._times, self._busy = [], []
        if any(t[1] == 0 or t[3] == 0 for t in every):
            return
        times, busy = [t[0].item() for t in every], [t[2].item() for t in every]
        by_compute, by_busy = slower_than_peers(times), slower_than_peers(busy)
        named = self.streaks.add([max(c, b) for c, b in zip(by_compute, by_busy, strict=False)])
        if not named:
            return

        def others(values: list[float], r: int) -> float:
            """The median of every rank's value but rank ``r``'s."""
            return statistics.median(values[:r] + values[r + 1 :])

        found = [
            {
                "rank": r,
                "node": self.nodes[r],
                "slower": round(excess, 4),
                "windows": n,
                "cause": "compute" if by_compute[r] > self.cfg.threshold else "host",
                "busy_s": busy[r],
                "others_busy_s": others(busy, r),
                "compute_s": times[r],
                "others_compute_s": others(times, r),
            }
            for r, excess, n in named
        ]
        record["stragglers"] = found
        if self.cfg.stop_after:
            self.persistent = [f for f in found if f["windows"] >= self.cfg.stop_after]
        if self.rank == 0:
            for f in found:
                print(
                    f"[straggler] step {step}: {describe(f)} (busy {f['busy_s']:.4f} s per step, others' median "
                    f"{f['others_busy_s']:.4f} s; compute {f['compute_s']:.4f} s, others' median "
                    f"{f['others_compute_s']:.4f} s)",
                    flush=True,
                )

    def close(self) -> None:
        """Stop the wait sampler."""
        if self.enabled:
            self.waits.close()


CAUSES = {
    "compute": "its computation is slower",
    "host": "the others wait for it, its computation is not slower (stopped, descheduled, waiting on data or storage)",
}


def describe(f: dict) -> str:
    """'rank 3 on n2, 14% slower than the median over 3 windows: its computation is slower'."""
    return (
        f"rank {f['rank']} on {f['node']}, {100 * f['slower']:.0f}% slower than the median over {f['windows']} "
        "windows: "
        f"{CAUSES[f['cause']]}"
    )
