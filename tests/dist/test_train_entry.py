"""The trainer's entry point refuses a bad layout in one line, exit 2, before any process group."""

from __future__ import annotations

import subprocess

import pytest

from train_helpers import ROOT, clean_env, free_port, train_cmd


@pytest.mark.parametrize(
    "world, local, local_rank, overrides, message",
    [
        (4, 4, 1, ["parallel.tp=4"], "parallel.tp=4 must divide the model's num_key_value_heads=2 (allowed: [1, 2])"),
        (4, 4, 1, ["parallel.dp=3", "parallel.tp=1"], "parallel.dp=3 x parallel.tp=1 = 3 must equal WORLD_SIZE=4"),
        (4, 1, 0, ["parallel.tp=2"], "parallel.tp=2 must divide the ranks per node LOCAL_WORLD_SIZE=1"),
        (4, 4, 1, ["optim.lrr=1"], "unknown key optim.lrr"),
        (1, 1, 0, [], "environment RANK=1: allowed 0 to 0 (WORLD_SIZE=1)"),
        (4, 8, 1, [], "environment LOCAL_WORLD_SIZE=8: allowed 1 to 4 (WORLD_SIZE=4)"),
        (4, 1, 1, [], "environment LOCAL_RANK=1: allowed 0 to 0 (LOCAL_WORLD_SIZE=1)"),
        (0, 1, 0, [], "environment WORLD_SIZE=0: allowed at least 1"),
    ],
)
def test_entry_point_rejects_bad_layout_before_process_group(world, local, local_rank, overrides, message):
    # Rank 1 of a job whose master port has no listener: any process-group work would block until the timeout.
    env = clean_env(RANK="1", LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(local),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(train_cmd(1, *overrides), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_entry_point_needs_a_rendezvous_for_several_ranks():
    env = clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    proc = subprocess.run(train_cmd(1), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "train: error: environment WORLD_SIZE=2 but MASTER_ADDR is not set: start the ranks with torchrun or hpc.node.launch"]
