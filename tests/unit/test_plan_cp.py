"""The planner's context parallelism: proposed only when nothing fits without it, by the trainer's own rules."""

from pathlib import Path

import pytest
import yaml
from train_helpers import TINY

from hpc.plan import ACT_B, PlanError, cp_choices, memory, plan, plan_layout, qwen3_shape
from hpc.site import load_site
from train.front.config import ParallelConfig, load_config
from train.front.layout import ParallelDims, WorldEnv

LONG = 131072


def test_a_sequence_too_long_for_one_gpu_is_split():
    """Qwen3-8B at 128k tokens on 8 x 80 GB: no tp fits even with checkpointing; cp=2 does."""
    s = qwen3_shape("8B")
    p = plan(s, 1, 8, 80, LONG, 1)
    assert not any(c.fits for c in p.candidates if c.cp == 1)
    c = p.chosen
    assert (c.cp, c.tp, c.dp, c.ac) == (2, 1, 4, True)
    assert c.layout.overrides() == ["parallel.tp=1", "parallel.cp=2", "activation_checkpointing=true"]
    whole = memory(s, 1, 8, True, LONG, 80)  # the same 8 GPUs without cp: FSDP shards the state as far
    half = memory(s, 1, 8, True, LONG // 2, 80)  # cp=2 holds half of the sequence's activations and loss ...
    gathered_kv = ACT_B * 2 * LONG * s.kv_heads * s.head_dim * 2  # ... plus the whole sequence's keys and values
    assert c.state_gb == pytest.approx(whole.state_gb) and c.loss_gb == pytest.approx(half.loss_gb)
    assert c.act_gb == pytest.approx(half.act_gb + gathered_kv / 1e9)


def test_cp_stays_out_while_a_layout_fits_without_it():
    assert {c.cp for c in plan(qwen3_shape("8B"), 2, 8, 80, 4096, 1).candidates} == {1}


@pytest.mark.parametrize("seq_len", [LONG, 3 * 2**15, 20 * 5000])
def test_planned_cp_passes_the_trainers_rules(seq_len):
    s, world = qwen3_shape("8B"), 16
    for tp in (1, 2, 4, 8):
        for cp in cp_choices(s, world, tp, seq_len, packed=False):
            dims = ParallelDims.build(ParallelConfig(tp=tp, cp=cp), WorldEnv(0, 0, world, 8), kv_heads=s.kv_heads)
            assert dims == ParallelDims(world // (tp * cp), tp, 1, cp)
            load_config(TINY, [f"seq_len={seq_len}", f"parallel.cp={cp}"])
    assert cp_choices(s, world, 1, 20 * 5000, packed=False) == [2, 4, 8, 16]  # 100000: 16 divides it, 32 does not
    assert cp_choices(s, world, 1, 3 * 2**15, packed=True) == []
    assert cp_choices(qwen3_shape("30B-A3B"), world, 1, LONG, packed=False) == []


def test_packed_rows_are_not_split():
    with pytest.raises(PlanError, match="Qwen3-8B does not fit 1 node"):
        plan(qwen3_shape("8B"), 1, 8, 80, LONG, 1, packed=True)


def test_trainer_config_gets_cp_from_the_planner(tmp_path):
    part = load_site("roce-h100").partition(None)
    raw = yaml.safe_load(Path(TINY).read_text())
    raw.update(model={"shape": "8B"}, seq_len=LONG, micro_batch=1, global_batch=8)
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    layout, note = plan_layout(load_config(str(cfg)), part, 1, 8)
    assert layout.cp == 2 and note.startswith("planner: dp=4 x cp=2 x tp=1, activation checkpointing on")
    assert layout.apply(load_config(str(cfg))).parallel.cp == 2
