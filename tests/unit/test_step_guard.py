"""StepGuard: the first step of each kind of failure (non-finite loss or gradient norm, a global batch without a loss
token, non-finite weights) as one line, in a one-process gloo group (no process is started)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from train.step_guard import StepGuard


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def steps(guard: StepGuard, values: list[tuple[float, float, int]], start: int = 1) -> None:
    for step, (loss, norm, tokens) in enumerate(values, start=start):
        guard.record(step, torch.tensor(loss, dtype=torch.float64), torch.tensor(norm), torch.tensor(tokens))


def test_healthy_steps_pass(group):
    guard = StepGuard(torch.device("cpu"))
    steps(guard, [(2.5, 1.0, 40), (2.4, 0.9, 1)])
    assert guard.problem(2, [torch.ones(3), torch.zeros(2)]) is None


@pytest.mark.parametrize(
    "values,step,what",
    [
        ([(2.5, 1.0, 40), (math.nan, 1.0, 40), (math.inf, math.nan, 40)], 2, "the loss turned non-finite (nan or inf)"),
        ([(2.5, 1.0, 40), (2.5, 1.0, 40), (2.5, math.inf, 40)], 3, "the gradient norm turned non-finite (nan or inf)"),
        ([(2.5, 1.0, 40), (0.0, 0.0, 0)], 2, "its global batch holds no loss token"),
    ],
)
def test_the_first_failure_is_named(group, values, step, what):
    guard = StepGuard(torch.device("cpu"))
    steps(guard, values)
    steps(guard, [(2.0, 1.0, 40)], start=len(values) + 1)  # a later healthy step does not clear it
    assert guard.problem(len(values) + 1) == (
        f"step {step}: {what}; the run stops without saving any step from {step} on "
        "(lower optim.lr, set grad_clip, or check the data: seq_len, data.overlong)"
    )


def test_non_finite_weights_are_named_only_when_checked(group):
    guard = StepGuard(torch.device("cpu"))
    steps(guard, [(2.5, 1.0, 40)])
    weights = [torch.ones(4), torch.tensor([1.0, math.inf])]
    assert guard.problem(7) is None
    assert guard.problem(7, weights).startswith("step 7: the weights hold non-finite values;")
