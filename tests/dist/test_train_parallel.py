"""End to end through `python -m train`: dp2 x tp2 equals one process, resume is exact, checkpoints reshard, export
loads.

Six launches share one module fixture (each costs ~15 s of imports on 2 cores; pairs run
concurrently): A = dp2 x tp2 for 20 steps (checkpoints at 10 and 20, written in the background
while training goes on; exported), S = one process from scratch, three runs resuming A's
step-10 checkpoint (dp2 x tp2; dp4 x tp1 with activation checkpointing; one process), and one
step starting from A's export as model.path.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import finish, launch, metrics, seed_checkpoint

STEPS, SAVE_AT = 20, 10
TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("train")
    dirs = {name: base / name for name in ("A", "S", "resume_same", "resume_dp4", "resume_1p", "from_export")}
    common = (f"steps={STEPS}", f"checkpoint.interval={SAVE_AT}", "checkpoint.keep_last=5")
    a = launch(4, dirs["A"], *common, "parallel.tp=2", "checkpoint.async_save=true", f"export={dirs['A'] / 'hf'}")
    s = launch(1, dirs["S"], *common, f"export={dirs['S'] / 'hf'}")
    out = {"A": finish(a, dirs["A"]), "S": finish(s, dirs["S"])}
    for name in ("resume_same", "resume_dp4", "resume_1p"):
        seed_checkpoint(dirs["A"], SAVE_AT, dirs[name])
    same = launch(4, dirs["resume_same"], *common, "parallel.tp=2")
    one = launch(1, dirs["resume_1p"], *common)
    out["resume_same"], out["resume_1p"] = finish(same, dirs["resume_same"]), finish(one, dirs["resume_1p"])
    dp4 = launch(4, dirs["resume_dp4"], *common, "parallel.tp=1", "activation_checkpointing=true")
    start = launch(
        1,
        dirs["from_export"],
        "model.shape=null",
        f"model.path={dirs['A'] / 'hf'}",
        "steps=1",
        "schedule.warmup_steps=0",
    )
    out["resume_dp4"], out["from_export"] = finish(dp4, dirs["resume_dp4"]), finish(start, dirs["from_export"])
    return {"dirs": dirs, "out": out}


def test_dp2_tp2_matches_single_process(runs):
    a, s = metrics(runs["dirs"]["A"]), metrics(runs["dirs"]["S"])
    assert sorted(a) == sorted(s) == list(range(1, STEPS + 1))
    loss_diff = max(abs(a[k]["loss"] - s[k]["loss"]) for k in a)
    gnorm_diff = max(abs(a[k]["grad_norm"] - s[k]["grad_norm"]) / s[k]["grad_norm"] for k in a)
    pa, ps = (
        load_file(runs["dirs"]["A"] / "hf" / "model.safetensors"),
        load_file(runs["dirs"]["S"] / "hf" / "model.safetensors"),
    )
    assert sorted(pa) == sorted(ps)
    param_diff = max((pa[k] - ps[k]).abs().max().item() for k in pa)
    print(
        f"dp2xtp2 vs 1 process over {STEPS} steps: max |loss diff| {loss_diff:.2e}, "
        f"max rel grad-norm diff {gnorm_diff:.2e}, max |param diff| {param_diff:.2e}"
    )
    assert loss_diff < TOL and gnorm_diff < TOL and param_diff < TOL
    assert a[STEPS]["loss"] < a[1]["loss"] - 0.3, "loss did not fall"


def test_layout_and_progress_are_reported(runs):
    out = runs["out"]["A"]
    assert "layout dp=2 x tp=2 on 4 ranks, mesh (dp, tp) [[0, 1], [2, 3]]" in out and "params" in out
    assert f"step {STEPS}/{STEPS} | loss" in out and "mfu n/a" in out
    assert (
        "resumed from" in runs["out"]["resume_same"]
        and f"(step {SAVE_AT}, saved under dp=2 x tp=2)" in runs["out"]["resume_same"]
    )
    assert f"checkpoint of step {SAVE_AT} copied to host memory in" in out and "writing in the background" in out
    assert "saved checkpoint" in runs["out"]["S"] and "writing in the background" not in runs["out"]["S"]


def test_checkpoints_are_complete_and_kept(runs):
    ckpts = sorted(p.name for p in (runs["dirs"]["A"] / "checkpoints").iterdir())
    assert ckpts == [".owner.json", f"step-{SAVE_AT:08d}", f"step-{STEPS:08d}"]  # and no .tmp left
    ckpts = ckpts[1:]
    for name in ckpts:
        assert (runs["dirs"]["A"] / "checkpoints" / name / "meta.json").is_file()


def test_resume_same_layout_is_bitwise_identical(runs):
    a, r = metrics(runs["dirs"]["A"]), metrics(runs["dirs"]["resume_same"])
    assert sorted(r) == list(range(SAVE_AT + 1, STEPS + 1))
    assert [r[k]["loss"] for k in r] == [a[k]["loss"] for k in r]
    assert [r[k]["grad_norm"] for k in r] == [a[k]["grad_norm"] for k in r]


@pytest.mark.parametrize("run", ["resume_dp4", "resume_1p"])
def test_resume_under_another_layout(runs, run):
    a, r = metrics(runs["dirs"]["A"]), metrics(runs["dirs"][run])
    assert sorted(r) == list(range(SAVE_AT + 1, STEPS + 1))
    diff = max(abs(r[k]["loss"] - a[k]["loss"]) for k in r)
    print(f"{run} vs dp2xtp2 over steps {SAVE_AT + 1}-{STEPS}: max |loss diff| {diff:.2e}")
    assert diff < TOL


def test_export_loads_and_generates(runs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = runs["dirs"]["A"] / "hf"
    model = AutoModelForCausalLM.from_pretrained(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    weights = load_file(hf / "model.safetensors")
    assert torch.equal(model.state_dict()["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    prompt = tokenizer("ROMEO:", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 8
    assert isinstance(tokenizer.decode(out[0]), str)


def test_training_starts_from_exported_hf_directory(runs):
    """model.path loads the weights exactly: the first step's loss equals the HF model's loss on the same batch."""
    from transformers import AutoModelForCausalLM

    from train.data import DataConfig, TokenStream, load_tokenizer, load_tokens

    hf, run = runs["dirs"]["A"] / "hf", runs["dirs"]["from_export"]
    model = AutoModelForCausalLM.from_pretrained(hf)
    tokens = load_tokens(DataConfig(), load_tokenizer(str(hf)), cache_dir=str(run / "cache"))
    batches = TokenStream(
        tokens, seq_len=32, global_batch=8, micro_batch=2, dp_rank=0, dp_size=1, seed=0
    ).next_microbatches()
    with torch.no_grad():
        expected = sum(
            torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten()).item()
            for x, y in batches
        ) / len(batches)
    assert abs(metrics(run)[1]["loss"] - expected) < TOL


def test_bf16_master_weights_train_checkpoint_and_export(tmp_path):
    """master_dtype=bf16: parameters, checkpointed optimizer state and the export are bf16; the loss falls as in
    fp32."""
    from torch.distributed.checkpoint import FileSystemReader

    run = tmp_path / "bf16"
    out = finish(launch(2, run, f"steps={STEPS}", "master_dtype=bf16", "dtype=bf16", "export=hf"), run)
    m = metrics(run)
    assert sorted(m) == list(range(1, STEPS + 1)) and m[STEPS]["loss"] < m[1]["loss"] - 0.3, out[-2000:]
    meta = FileSystemReader(str(run / "checkpoints" / f"step-{STEPS:08d}")).read_metadata().state_dict_metadata
    dtypes = {k: v.properties.dtype for k, v in meta.items() if hasattr(v, "properties")}
    assert dtypes["model.model.embed_tokens.weight"] == torch.bfloat16
    assert {d for k, d in dtypes.items() if k.startswith("optim.state.") and k.endswith(("exp_avg", "exp_avg_sq"))} == {
        torch.bfloat16
    }
    weights = load_file(run / "hf" / "model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(run / "hf").dtype == torch.bfloat16


def test_one_rank_bf16_compute_keeps_fp32_master_weights(tmp_path):
    """One rank has no FSDP: bf16 model, fp32 master twin. It trains like dp2 under FSDP's bf16/fp32 mixed precision,
    checkpoints fp32 weights and AdamW state, and resumes from them exactly."""
    from torch.distributed.checkpoint import FileSystemReader

    one, dp2, resumed = tmp_path / "one", tmp_path / "dp2", tmp_path / "resumed"
    common = (f"steps={STEPS}", f"checkpoint.interval={SAVE_AT}", "checkpoint.keep_last=5", "dtype=bf16")
    procs = [launch(1, one, *common), launch(2, dp2, *common)]
    for proc, run in zip(procs, (one, dp2), strict=True):
        finish(proc, run)
    m1, m2 = metrics(one), metrics(dp2)
    diff = max(abs(m1[k]["loss"] - m2[k]["loss"]) for k in m2)
    print(f"one rank (master weights) vs dp2 (FSDP), bf16 compute, {STEPS} steps: max |loss diff| {diff:.2e}")
    assert sorted(m1) == list(range(1, STEPS + 1)) and diff < 2e-3
    meta = FileSystemReader(str(one / "checkpoints" / f"step-{SAVE_AT:08d}")).read_metadata().state_dict_metadata
    dtypes = {k: v.properties.dtype for k, v in meta.items() if hasattr(v, "properties")}
    assert dtypes["model.model.embed_tokens.weight"] == torch.float32
    assert {d for k, d in dtypes.items() if k.startswith("optim.state.") and k.endswith(("exp_avg", "exp_avg_sq"))} == {
        torch.float32
    }
    seed_checkpoint(one, SAVE_AT, resumed)
    finish(launch(1, resumed, *common), resumed)
    r = metrics(resumed)
    assert sorted(r) == list(range(SAVE_AT + 1, STEPS + 1))
    assert [r[k]["loss"] for k in r] == [m1[k]["loss"] for k in r]
