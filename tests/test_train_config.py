"""Trainer configuration and layout validation: one-line errors, exit 2, before any process group."""

from __future__ import annotations

import socket
import subprocess

import pytest

from train.config import SHAPES, ConfigError, ParallelConfig, apply_overrides, load_config
from train.parallel import ParallelDims, WorldEnv
from train_helpers import ROOT, TINY, clean_env, train_cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shipped_configs_validate():
    for path in (ROOT / "train" / "configs").glob("*.yaml"):
        load_config(path)


def test_overrides_parse_yaml_scalars():
    raw = apply_overrides({"optim": {"lr": 1.0}}, ["optim.lr=1e-3", "parallel.tp=2", "export=null", "optim.betas=[0.9, 0.99]"])
    assert raw == {"optim": {"lr": 1e-3, "betas": [0.9, 0.99]}, "parallel": {"tp": 2}, "export": None}
    cfg = load_config(TINY, ["optim.lr=2e-3", "parallel.tp=2"])
    assert cfg.optim.lr == 2e-3 and cfg.parallel.tp == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1"], "unknown key optim.lrr (allowed here: lr, betas, weight_decay, eps)"),
        (["model.shape=3B"], "model.shape='3B'"),
        (["global_batch=7"], "global_batch=7 must be a multiple of micro_batch=2"),
        (["steps=0"], "steps=0"),
        (["model.path=/nonexistent"], "exactly one of model.shape"),
        (["steps.x=1"], "steps is a value, not a section"),
        (["parallel.tp"], "expected key.sub=value"),
    ],
)
def test_config_errors_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_parallel_dims():
    env = WorldEnv(rank=0, local_rank=0, world_size=8, local_world_size=4)
    assert ParallelDims.build(ParallelConfig(tp=2), env, kv_heads=8) == ParallelDims(dp=4, tp=2)
    with pytest.raises(ConfigError, match="must divide the ranks per node LOCAL_WORLD_SIZE=4"):
        ParallelDims.build(ParallelConfig(tp=8), env, kv_heads=8)
    with pytest.raises(ConfigError, match=r"allowed: \[1, 2\]"):
        ParallelDims.build(ParallelConfig(tp=4), env, kv_heads=2)
    with pytest.raises(ConfigError, match="must equal WORLD_SIZE=8"):
        ParallelDims.build(ParallelConfig(dp=3, tp=2), env, kv_heads=8)
    with pytest.raises(ConfigError, match="multiple of micro_batch x dp = 2 x 4"):
        ParallelDims(dp=4, tp=2).grad_accum(global_batch=12, micro_batch=2)


def test_every_qwen3_shape_allows_tp8():
    assert all(SHAPES[s].num_key_value_heads == 8 for s in SHAPES if s != "tiny")


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
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
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
