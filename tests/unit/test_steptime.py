"""Compute or network: the step-time split (CPU branch; the GPU branch reads the profiler's kernels)."""

import time

import torch

from train.steptime import busy_seconds, timed_step


def test_busy_seconds_is_the_union_of_intervals():
    assert busy_seconds([]) == 0
    assert busy_seconds([(0, 2), (1, 3), (5, 6)]) == 4
    assert busy_seconds([(0, 10), (2, 3), (4, 5)]) == 10


def test_waiting_counts_as_wait_and_arithmetic_as_compute():
    out, split = timed_step(lambda: time.sleep(0.3) or "slept", torch.device("cpu"))
    assert out == "slept" and split["wait_s"] > 0.25 and split["compute_s"] < 0.05

    def work():  # 0.3 s of this thread's CPU time, however busy the machine is
        x = torch.randn(256, 256)
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.3:
            x = (x @ x).tanh()
        return x

    _, split = timed_step(work, torch.device("cpu"))
    assert split["compute_s"] >= 0.29 and split["wait_s"] >= 0
