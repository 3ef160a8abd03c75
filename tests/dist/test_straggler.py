"""Straggler naming through the real trainer under torchrun (gloo on CPU): a rank made slow by the test-only setting
is named with its node within three windows, and nobody else; a clean run names nobody, for under 1% overhead."""

import re
import socket

from train_helpers import finish, launch, metrics

WINDOW = ["straggler.every=5", "straggler.windows=3", "checkpoint.interval=0"]


def test_the_slow_rank_is_named_with_its_node(tmp_path):
    run = tmp_path / "slow"
    out = finish(launch(3, run, "steps=15", "global_batch=6", *WINDOW, "straggler.test_slow_rank=2", "straggler.test_slow_s=0.05"), run)
    node = socket.gethostname()
    lines = [l for l in out.splitlines() if l.startswith("[straggler]")]
    assert len(lines) == 1, out[-3000:]
    assert re.fullmatch(rf"\[straggler\] step 15: rank 2 on {re.escape(node)}, \d+% slower than the median over 3 windows "
                        r"\(compute [\d.]+ s per step, others' median [\d.]+ s\)", lines[0]), lines[0]
    records = metrics(run)
    named = records[15]["stragglers"]
    assert [(f["rank"], f["node"], f["windows"]) for f in named] == [(2, node, 3)]
    assert named[0]["compute_s"] > named[0]["others_median_s"] + 0.04  # the 0.05 s of extra compute, measured
    assert all("stragglers" not in records[s] for s in range(1, 15))


def test_a_clean_run_names_nobody(tmp_path):
    run = tmp_path / "clean"
    out = finish(launch(2, run, "steps=20", *WINDOW), run)
    records = metrics(run)
    assert "[straggler]" not in out and not any("stragglers" in r for r in records.values())
    overhead = records[20]["straggler_overhead_s"]
    total = sum(r["step_time_s"] for r in records.values())
    print(f"\n[straggler] overhead {overhead * 1e3:.2f} ms of {total:.2f} s of steps ({100 * overhead / total:.3f}%)")
    assert 0 < overhead < 0.01 * total
