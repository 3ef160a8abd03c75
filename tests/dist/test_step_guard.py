"""A run whose loss turns non-finite stops with one line, exit 1, before it saves any step from there on
(the real `python -m train` on CPU, one process and dp2 under torchrun)."""

from __future__ import annotations

import re
import subprocess

import pytest
from train_helpers import ROOT, clean_env, metrics, train_cmd

from hpc.node.contract import EXIT_FAILED
from train.checkpoint import complete_checkpoints


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_loss_turning_non_finite_stops_the_run_before_it_is_saved(tmp_path, nproc):
    run_dir = tmp_path / "r"
    overrides = ["steps=8", "checkpoint.interval=2", "checkpoint.keep_last=10", "schedule.warmup_steps=1"]
    proc = subprocess.run(
        train_cmd(nproc, f"log.dir={run_dir}", "optim.lr=1e30", *overrides),
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("train: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]  # rank 0's line (torchrun adds its own report of the failed ranks)
    found = re.fullmatch(
        r"train: error: step (\d+): the (loss|gradient norm) turned non-finite \(nan or inf\); the run stops "
        r"without saving any step from \1 on \(lower optim.lr, set grad_clip, or check the data: seq_len, "
        r"data.overlong\)",
        lines[0],
    )
    assert found, lines[0]
    bad = int(found.group(1))
    logged = metrics(run_dir)
    assert bad in logged and max(logged) == bad  # the bad step is in metrics.jsonl, nothing after it ran
    saved = [s for s, _ in complete_checkpoints(run_dir / "checkpoints")]
    assert all(s < bad for s in saved), (saved, bad)
    print(f"\n[guard] nproc={nproc}: stopped at step {bad}, checkpoints kept {saved}")
