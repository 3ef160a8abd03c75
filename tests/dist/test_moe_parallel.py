"""Expert parallelism end to end through `python -m train` on the tiny MoE: ep1 (one process), ep2 x dp2, ep4 x dp4 and
ep2 x dp2 x tp2 (with activation checkpointing, resumed from the ep2 run's checkpoint) give the same losses for 20 steps;
an ep2 x dp4 run starting from an exported HF Qwen3-MoE directory (each rank reading its experts) starts at the loss that
transformers' model gives on the same batch.

Five launches in one module fixture, pairs running concurrently.
"""

from __future__ import annotations

import pytest
import torch

from train_helpers import finish, launch, metrics, seed_checkpoint

STEPS, SAVE_AT = 20, 10
TOL = 1e-5
MOE = ("model.shape=tiny-moe", f"steps={STEPS}", "checkpoint.keep_last=5")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("moe")
    dirs = {name: base / name for name in ("ep1", "ep2", "ep4", "ep2_tp2", "from_hf")}
    one = launch(1, dirs["ep1"], *MOE, "checkpoint.interval=0", "export=hf")
    ep2 = launch(2, dirs["ep2"], *MOE, f"checkpoint.interval={SAVE_AT}", "parallel.ep=2")
    out = {"ep1": finish(one, dirs["ep1"]), "ep2": finish(ep2, dirs["ep2"])}
    seed_checkpoint(dirs["ep2"], SAVE_AT, dirs["ep2_tp2"])
    ep4 = launch(4, dirs["ep4"], *MOE, "checkpoint.interval=0", "parallel.ep=4")
    out["ep4"] = finish(ep4, dirs["ep4"])
    tp2 = launch(4, dirs["ep2_tp2"], *MOE, "checkpoint.interval=0", "parallel.ep=2", "parallel.tp=2", "activation_checkpointing=true")
    hf = launch(4, dirs["from_hf"], "model.shape=null", f"model.path={dirs['ep1'] / 'hf'}", "steps=1", "schedule.warmup_steps=0", "parallel.ep=2")
    out["ep2_tp2"], out["from_hf"] = finish(tp2, dirs["ep2_tp2"]), finish(hf, dirs["from_hf"])
    return {"dirs": dirs, "out": out}


@pytest.mark.parametrize("run", ["ep2", "ep4", "ep2_tp2"])
def test_expert_parallel_losses_equal_one_process(runs, run):
    one, other = metrics(runs["dirs"]["ep1"]), metrics(runs["dirs"][run])
    steps = list(range(SAVE_AT + 1 if run == "ep2_tp2" else 1, STEPS + 1))
    assert sorted(other) == steps
    diff = {k: max(abs(other[s][k] - one[s][k]) for s in steps) for k in ("loss", "grad_norm", "moe_aux_loss", "moe_load_imbalance")}
    print(f"{run} vs one process over steps {steps[0]}-{STEPS}: max |diff| {diff}")
    assert diff["loss"] < TOL and diff["moe_aux_loss"] < TOL and diff["grad_norm"] < 1e-4 and diff["moe_load_imbalance"] < 1e-6
    assert one[STEPS]["loss"] < one[1]["loss"] - 0.3 and one[1]["moe_load_imbalance"] >= 1.0


def test_expert_split_is_logged_and_resume_loads_under_another_layout(runs):
    assert "experts split over ep=4" in runs["out"]["ep4"]
    assert f"resumed from {runs['dirs']['ep2_tp2'] / 'checkpoints' / f'step-{SAVE_AT:08d}'}" in runs["out"]["ep2_tp2"]


def test_training_starts_from_an_hf_moe_directory_under_ep(runs):
    from transformers import AutoModelForCausalLM, Qwen3MoeForCausalLM

    from train.data import DataConfig, TokenStream, load_tokenizer, load_tokens

    hf, run = runs["dirs"]["ep1"] / "hf", runs["dirs"]["from_hf"]
    model = AutoModelForCausalLM.from_pretrained(hf)
    assert isinstance(model, Qwen3MoeForCausalLM)
    tokens = load_tokens(DataConfig(), load_tokenizer(str(hf)), cache_dir=str(run / "cache"))
    batches = TokenStream(tokens, seq_len=32, global_batch=8, micro_batch=2, dp_rank=0, dp_size=1, seed=0).next_microbatches()
    with torch.no_grad():
        expected = sum(torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten()).item() for x, y in batches) / len(batches)
    got = metrics(run)[1]["loss"]
    print(f"first step from the exported HF MoE directory under ep2 x dp4: {got:.6f}, transformers on the batch: {expected:.6f}")
    assert abs(got - expected) < TOL
