"""Trainer configuration and layout validation: one-line errors, exit 2, before any process group."""

from __future__ import annotations

import pytest
from train_helpers import ROOT, TINY

from train.front.config import SHAPES, ConfigError, ParallelConfig, apply_overrides, load_config
from train.parallel import ParallelDims, WorldEnv


def test_shipped_configs_validate():
    for path in (ROOT / "train" / "configs").glob("*.yaml"):
        load_config(path)


def test_overrides_parse_yaml_scalars():
    raw = apply_overrides(
        {"optim": {"lr": 1.0}}, ["optim.lr=1e-3", "parallel.tp=2", "export=null", "optim.betas=[0.9, 0.99]"]
    )
    assert raw == {"optim": {"lr": 1e-3, "betas": [0.9, 0.99]}, "parallel": {"tp": 2}, "export": None}
    cfg = load_config(TINY, ["optim.lr=2e-3", "parallel.tp=2"])
    assert cfg.optim.lr == 2e-3 and cfg.parallel.tp == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1"], "unknown key optim.lrr (allowed here: lr, betas, weight_decay, eps)"),
        (["model.shape=3B"], "model.shape='3B'"),
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
    assert ParallelDims(dp=4, tp=2).batch_split(global_batch=12, micro_batch=2).accum == 2


def test_every_dense_qwen3_shape_allows_tp8():
    assert all(
        SHAPES[s].num_key_value_heads == 8 for s in SHAPES if not s.startswith("tiny") and not SHAPES[s].num_experts
    )
    assert all(SHAPES[s].num_key_value_heads == 4 for s in ("30B-A3B", "235B-A22B"))  # the MoE models: tp up to 4
