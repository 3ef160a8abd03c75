"""Expert parallelism end to end through `python -m train`, every run starting from one HF Qwen3-MoE directory
(transformers' per-expert files; each rank reads the experts it holds): ep1 (one process), ep2 x dp4 (experts also
FSDP-sharded over 2 ranks), ep4 x dp4, and ep2 x dp2 x tp2 with activation checkpointing resumed from the ep1 run's
checkpoint give the same losses for 20 steps; resuming that checkpoint in the same layout is bitwise; the first step's
loss is transformers' on the same batch.

Five launches in one module fixture, two or three running concurrently.
"""

from __future__ import annotations

import pytest
import torch
from train_helpers import finish, launch, metrics, seed_checkpoint
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from train.data import DataConfig, TokenStream, load_tokenizer, load_tokens

STEPS, SAVE_AT = 20, 10
TOL = 1e-5


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "qwen3-moe"
    tok = load_tokenizer(None)
    config = Qwen3MoeConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        sliding_window=None,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(7)
    Qwen3MoeForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, hf_dir) -> dict:
    base = tmp_path_factory.mktemp("moe")
    dirs = {name: base / name for name in ("ep1", "ep2_dp4", "ep4", "ep2_tp2", "resume_same")}
    common = ("model.shape=null", f"model.path={hf_dir}", f"steps={STEPS}", "checkpoint.keep_last=5")
    one = launch(1, dirs["ep1"], *common, f"checkpoint.interval={SAVE_AT}")
    ep2 = launch(4, dirs["ep2_dp4"], *common, "checkpoint.interval=0", "parallel.ep=2")
    out = {"ep1": finish(one, dirs["ep1"]), "ep2_dp4": finish(ep2, dirs["ep2_dp4"])}
    seed_checkpoint(dirs["ep1"], SAVE_AT, dirs["ep2_tp2"])
    seed_checkpoint(dirs["ep1"], SAVE_AT, dirs["resume_same"])
    ep4 = launch(4, dirs["ep4"], *common, "checkpoint.interval=0", "parallel.ep=4")
    tp2 = launch(
        4,
        dirs["ep2_tp2"],
        *common,
        "checkpoint.interval=0",
        "parallel.ep=2",
        "parallel.tp=2",
        "activation_checkpointing=true",
    )
    same = launch(1, dirs["resume_same"], *common, "checkpoint.interval=0")
    out["ep4"], out["ep2_tp2"], out["resume_same"] = (
        finish(ep4, dirs["ep4"]),
        finish(tp2, dirs["ep2_tp2"]),
        finish(same, dirs["resume_same"]),
    )
    return {"dirs": dirs, "out": out}


@pytest.mark.parametrize("run", ["ep2_dp4", "ep4", "ep2_tp2"])
def test_expert_parallel_losses_equal_one_process(runs, run):
    one, other = metrics(runs["dirs"]["ep1"]), metrics(runs["dirs"][run])
    steps = list(range(SAVE_AT + 1 if run == "ep2_tp2" else 1, STEPS + 1))
    assert sorted(other) == steps
    diff = {
        k: max(abs(other[s][k] - one[s][k]) for s in steps)
        for k in ("loss", "grad_norm", "moe_aux_loss", "moe_load_imbalance")
    }
    print(f"{run} vs one process over steps {steps[0]}-{STEPS}: max |diff| {diff}")
    assert (
        diff["loss"] < TOL
        and diff["moe_aux_loss"] < TOL
        and diff["grad_norm"] < 1e-4
        and diff["moe_load_imbalance"] < 1e-6
    )
    assert one[STEPS]["loss"] < one[1]["loss"] - 0.3 and one[1]["moe_load_imbalance"] >= 1.0


def test_resume_in_the_same_layout_is_bitwise(runs):
    one, resumed = metrics(runs["dirs"]["ep1"]), metrics(runs["dirs"]["resume_same"])
    assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1))
    keys = ("loss", "grad_norm", "moe_aux_loss", "moe_load_imbalance")
    assert all(resumed[s][k] == one[s][k] for s in resumed for k in keys)


def test_expert_split_is_logged_and_resume_loads_under_another_layout(runs):
    assert "experts split over ep=4" in runs["out"]["ep4"]
    assert f"resumed from {runs['dirs']['ep2_tp2'] / 'checkpoints' / f'step-{SAVE_AT:08d}'}" in runs["out"]["ep2_tp2"]


def test_first_step_is_transformers_loss_on_the_batch(runs, hf_dir):
    model = Qwen3MoeForCausalLM.from_pretrained(hf_dir)
    tokens = load_tokens(DataConfig(), load_tokenizer(str(hf_dir)), cache_dir=str(runs["dirs"]["ep1"] / "cache"))
    batches = TokenStream(
        tokens, seq_len=32, global_batch=8, micro_batch=2, dp_rank=0, dp_size=1, seed=0
    ).next_microbatches()
    with torch.no_grad():
        expected = sum(
            torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten()).item()
            for x, y in batches
        ) / len(batches)
    got = metrics(runs["dirs"]["ep2_dp4"])[1]["loss"]
    print(f"first step from the HF MoE directory under ep2 x dp4: {got:.6f}, transformers on the batch: {expected:.6f}")
    assert abs(got - expected) < TOL
