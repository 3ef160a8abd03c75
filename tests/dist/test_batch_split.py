"""A global batch that dp does not divide trains the same step as one process, and a resume at another dp keeps it.

Three launches of the tiny config's mixture of experts (so the load-balancing loss, which padding must not count, is
compared too), global_batch 4 of micro-batches of at most 1 row: A on dp=3 (ranks take 2, 1 and 1 rows, so ranks 1 and
2 run a padding micro-batch each step), S in one process (the oracle), and R on dp=4 resuming A's step-2 checkpoint
(one row per rank: no accumulation)."""

from __future__ import annotations

import pytest
from train_helpers import finish, launch, metrics, seed_checkpoint

COMMON = (
    "model.shape=tiny-moe",
    "global_batch=4",
    "micro_batch=1",
    "steps=4",
    "schedule.warmup_steps=2",
    "checkpoint.interval=2",
    "checkpoint.keep_last=3",
    "log.log_every=1",
)
TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("split")
    dirs = {name: base / name for name in ("A", "S", "R")}
    a, s = launch(3, dirs["A"], *COMMON), launch(1, dirs["S"], *COMMON)
    out = {"A": finish(a, dirs["A"]), "S": finish(s, dirs["S"])}
    seed_checkpoint(dirs["A"], 2, dirs["R"])
    out["R"] = finish(launch(4, dirs["R"], *COMMON), dirs["R"])
    return {"dirs": dirs, "out": out}


def test_uneven_dp_trains_the_single_process_steps(runs):
    a, s = metrics(runs["dirs"]["A"]), metrics(runs["dirs"]["S"])
    assert sorted(a) == sorted(s) == [1, 2, 3, 4]
    assert max(abs(a[k]["loss"] - s[k]["loss"]) for k in a) < TOL
    assert max(abs(a[k]["grad_norm"] - s[k]["grad_norm"]) / s[k]["grad_norm"] for k in a) < TOL
    assert max(abs(a[k]["moe_aux_loss"] - s[k]["moe_aux_loss"]) for k in a) < TOL
    assert all(a[k]["loss_tokens"] == s[k]["loss_tokens"] == 4 * 32 for k in a)  # padding counts no loss token
    assert "global_batch 4 = dp 3 x 1-2 rows, grad accumulation 2 x micro-batches of at most 1 rows" in runs["out"]["A"]
    assert "global_batch 3 or 6 splits evenly" in runs["out"]["A"]


def test_resume_at_another_dp_keeps_the_global_batch(runs):
    r, s = metrics(runs["dirs"]["R"]), metrics(runs["dirs"]["S"])
    assert sorted(r) == [3, 4]
    assert max(abs(r[k]["loss"] - s[k]["loss"]) for k in r) < TOL
    assert "the same global_batch 4: grad accumulation 1 at dp=4 (it was 2 at dp=3)" in runs["out"]["R"]
