"""The trainer's entry point as a process: a bad layout is one line, exit 2, before any process group (the other
layouts' messages are checked in process: tests/bad_input_cases.py)."""

from __future__ import annotations

import subprocess

from train_helpers import ROOT, clean_env, train_cmd


def test_entry_point_needs_a_rendezvous_for_several_ranks():
    env = clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    proc = subprocess.run(train_cmd(1), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "train: error: environment WORLD_SIZE=2 but MASTER_ADDR is not set: "
        "start the ranks with torchrun or hpc.node.launch"
    ]
