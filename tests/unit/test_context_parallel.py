"""Context parallelism's rules in process: how rows are cut over the cp ranks, and the refusals of parallel.cp."""

from __future__ import annotations

import pytest
import torch
from train_helpers import TINY

from train.context_parallel import SequenceShards
from train.front.config import ConfigError, ParallelConfig, load_config
from train.front.layout import CP, DP, DP_CP, EFSDP, EP, TP, Layout, ParallelDims, WorldEnv


@pytest.mark.parametrize("seq_len,cp", [(32, 2), (24, 4), (12, 3), (6, 2), (15, 5), (8, 1)])
def test_slices_cover_each_position_once_and_gather_back_in_order(seq_len, cp):
    shards = [SequenceShards(seq_len, cp, r) for r in range(cp)]
    held = [s.positions() for s in shards]
    assert all(len(p) == seq_len // cp for p in held)
    assert sorted(torch.cat(held).tolist()) == list(range(seq_len))
    rows = torch.arange(3 * seq_len).view(3, seq_len)
    for s, p in zip(shards, held, strict=True):
        assert torch.equal(s.shard(rows), rows[:, p])
    # the all-gather concatenates the slices rank by rank; sequence_order puts their chunks back in order
    c = shards[0].chunk_len
    gathered = torch.cat(held).view(-1, c)
    assert torch.equal(gathered[shards[0].sequence_order()].flatten(), torch.arange(seq_len))


@pytest.mark.parametrize("seq_len,cp,balanced", [(32, 2, True), (20, 4, False), (48, 4, True), (15, 3, False)])
def test_causal_work_is_balanced_where_seq_len_is_a_multiple_of_2cp(seq_len, cp, balanced):
    """A query at position p attends to p + 1 keys; zigzag chunks give every rank the same count."""
    work = [(SequenceShards(seq_len, cp, r).positions() + 1).sum().item() for r in range(cp)]
    assert (len(set(work)) == 1) == balanced
    assert SequenceShards(seq_len, cp, 0).num_chunks == (2 * cp if balanced else cp)


def test_dims_with_cp():
    env = WorldEnv(0, 0, 8, 8)
    assert ParallelDims.build(ParallelConfig(cp=2, tp=2), env, kv_heads=2) == ParallelDims(dp=2, tp=2, cp=2)
    assert ParallelDims.build(ParallelConfig(cp=8), env, kv_heads=2) == ParallelDims(dp=1, tp=1, cp=8)
    with pytest.raises(ConfigError, match=r"^parallel\.cp=3 x parallel\.tp=1 = 3 must divide WORLD_SIZE=8$"):
        ParallelDims.build(ParallelConfig(cp=3), env, kv_heads=2)
    with pytest.raises(ConfigError, match=r"^parallel\.dp=4 x parallel\.cp=2 x parallel\.tp=2 = 16 must equal"):
        ParallelDims.build(ParallelConfig(dp=4, cp=2, tp=2), env, kv_heads=2)
    with pytest.raises(ConfigError, match=r"^parallel\.cp=2 needs a dense model"):
        ParallelDims.build(ParallelConfig(cp=2), env, kv_heads=2, num_experts=8)


def test_mesh_dims_with_cp():
    """cp sits between dp and tp, and dp x cp flatten to dp_cp (FSDP's dimension); ep keeps its own mesh."""
    dims = ParallelDims(dp=2, tp=2, cp=4)
    assert dims.cp_enabled and not dims.ep_enabled
    assert dims.mesh_dims() == ((2, 4, 2), (DP, CP, TP))
    assert dims.flattened() == (DP_CP, (DP, CP))
    plain = ParallelDims(dp=4, tp=2)
    assert not plain.cp_enabled
    assert plain.mesh_dims() == ((4, 2), (DP, TP))
    assert plain.flattened() is None
    experts = ParallelDims(dp=4, tp=1, ep=2)
    assert experts.mesh_dims() == ((2, 2, 1), (EFSDP, EP, TP))
    assert experts.flattened() == (DP, (EFSDP, EP))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["parallel.cp=3"], "parallel.cp=3 must divide seq_len=32"),
        (["parallel.cp=2", "data.pack=documents"], "parallel.cp=2 splits each sequence over ranks, which rows packed"),
        (["parallel.cp=0"], "parallel.cp=0: Input should be greater than or equal to 1"),
    ],
)
def test_config_refuses(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(TINY, overrides)
    assert "\n" not in str(e.value)


def test_plain_and_balanced_seq_lens_are_accepted():
    assert load_config(TINY, ["parallel.cp=4"]).parallel.cp == 4  # 32 = 2 x 4 x 4: balanced
    assert load_config(TINY, ["parallel.cp=4", "seq_len=36"]).parallel.cp == 4  # 36 = 4 x 9: plain


def test_layout_overrides_carry_cp():
    assert Layout(tp=2, cp=4).overrides() == ["parallel.tp=2", "parallel.cp=4"]
    assert Layout(tp=1).overrides() == ["parallel.tp=1"]
