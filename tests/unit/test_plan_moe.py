"""The planner on the mixtures of experts: total vs active parameters against the trainer's own model, the EP choice,
memory and all-to-all figures, and the layout it proposes."""

import pytest

from hpc.plan import ep_choice, memory, plan, qwen3_shape, report, tp_choices
from hpc.site import load_site
from train.data.tokenizer import load_tokenizer
from train.front.config import ConfigError, ModelConfig, ParallelConfig
from train.front.layout import ParallelDims, WorldEnv
from train.metrics import flops_per_token
from train.model import count_params, hf_config


def test_total_active_and_flops_equal_the_trainers_model():
    s = qwen3_shape("30B-A3B")
    config = hf_config(ModelConfig(shape="30B-A3B"), load_tokenizer(None))
    counted = count_params(config)
    assert s.params == counted["total"]
    assert s.active_params == counted["active_non_embedding"] + counted["embedding"] + counted["lm_head"]  # untied
    assert s.flops_per_token(4096) == flops_per_token(counted, s.layers, s.heads, s.head_dim, 4096)
    assert s.active_params < s.params / 9


def test_ep_is_the_largest_group_inside_a_node_dividing_dp_and_the_experts():
    s = qwen3_shape("30B-A3B")
    assert [ep_choice(s, tp, 64 // tp, 8) for tp in (1, 2, 4)] == [8, 4, 2]
    assert ep_choice(s, 1, 6, 8) == 2  # ep divides dp=6 and 128 experts
    assert ep_choice(qwen3_shape("8B"), 1, 16, 8) == 1


@pytest.mark.parametrize("name", ["30B-A3B", "235B-A22B", "8B"])
def test_the_trainer_accepts_every_ep_the_planner_chooses(name):
    """Planner and trainer share one ep rule: each choice passes ParallelDims, a larger ep inside the node does not."""
    s = qwen3_shape(name)
    for gpus in (1, 2, 4, 6, 8):
        for nodes in (1, 3, 4):
            for tp in tp_choices(s, gpus):
                dp = nodes * gpus // tp
                env = WorldEnv(rank=0, local_rank=0, world_size=nodes * gpus, local_world_size=gpus)
                ep = ep_choice(s, tp, dp, gpus)
                assert ParallelDims.build(ParallelConfig(tp=tp, ep=ep), env, s.kv_heads, s.experts) == ParallelDims(
                    dp, tp, ep
                )
                for larger in range(ep + 1, gpus // tp + 1):
                    with pytest.raises(ConfigError, match=f"parallel.ep={larger} "):
                        ParallelDims.build(ParallelConfig(tp=tp, ep=larger), env, s.kv_heads, s.experts)


def test_ep_shrinks_the_gathered_experts_not_the_sharded_state():
    s, tokens = qwen3_shape("235B-A22B"), 4096
    one, eight = memory(s, 1, 64, False, tokens, 141, ep=1), memory(s, 1, 64, False, tokens, 141, ep=8)
    assert one.state_gb == eight.state_gb
    assert one.gathered_gb - eight.gathered_gb == pytest.approx(10 * s.expert_layer_params * (1 - 1 / 8) / 1e9)
    assert one.gathered_gb > 24  # a whole layer's 128 experts gathered at once: why EP


def test_plans_for_the_shipped_profiles():
    site = load_site("ib-h200")
    p30 = plan(qwen3_shape("30B-A3B"), 1, 8, 141, 4096, 1)
    assert (p30.chosen.tp, p30.chosen.dp, p30.chosen.ep, p30.chosen.ac) == (1, 8, 8, False)
    text = report(p30, site, site.partition(None))
    assert "parallel.tp=1 parallel.ep=8" in text and "active 3.35 B per token" in text and "EP traffic at ep=8" in text
    p235 = plan(qwen3_shape("235B-A22B"), 8, 8, 141, 4096, 1)
    assert p235.chosen.ep == 8 and p235.chosen.fits
