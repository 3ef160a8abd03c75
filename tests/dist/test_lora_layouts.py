"""LoRA under dp x tp: dp2 x tp2 (adapters sharded with their base layers, FSDP over dp) trains like one process and
exports the same adapters; a resume from a checkpoint is bitwise equal in the same layout and equal within float
tolerance under another; a checkpoint of other lora settings is refused in one line (exit 2)."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import clean_env, finish, launch, metrics, seed_checkpoint, train_cmd

from train.front.data_sources import DEMO_CORPUS

STEPS = 6
LORA = [
    "lora.enabled=true",
    "lora.r=4",
    "lora.alpha=8",
    f"steps={STEPS}",
    "log.log_every=1",
    "checkpoint.interval=3",
    "checkpoint.keep_last=3",
    "schedule.warmup_steps=1",
    "optim.lr=1e-2",
    "export=peft",
]


def _losses(run, steps) -> list[float]:
    m = metrics(run)
    return [m[s]["loss"] for s in steps]


@pytest.fixture(scope="module", autouse=True)
def small_corpus(tmp_path_factory):
    """The first 60,000 characters of the demo corpus: each run tokenizes its data, and these runs need little."""
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    with DEMO_CORPUS.open() as f:
        path.write_text(json.dumps({"text": json.loads(next(f))["text"][:60_000]}) + "\n")
    LORA.append(f"data.path={path}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, small_corpus):
    one, four = tmp_path_factory.mktemp("lora_one"), tmp_path_factory.mktemp("lora_dp2tp2")
    procs = [(launch(1, one, *LORA), one), (launch(4, four, *LORA, "parallel.tp=2"), four)]
    for proc, run in procs:
        finish(proc, run)
    return one, four


def test_dp2_tp2_equals_one_process(runs):
    one, four = runs
    torch.testing.assert_close(
        torch.tensor(_losses(four, range(1, STEPS + 1))),
        torch.tensor(_losses(one, range(1, STEPS + 1))),
        rtol=1e-5,
        atol=0,
    )
    a, b = load_file(one / "peft" / "adapter_model.safetensors"), load_file(four / "peft" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and len(a) == 2 * 7 * 2
    for key in (
        a
    ):  # per tensor: Adam's g / sqrt(v) turns a gradient entry near zero, summed in another order, into a step of lr
        assert torch.linalg.norm(b[key] - a[key]) <= 1e-3 * torch.linalg.norm(a[key]), key
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k), "B trained away from zero"
    meta = json.loads((four / "checkpoints" / "step-00000006" / "meta.json").read_text())
    assert meta["written_with"]["lora.r"] == 4 and meta["dp"] == 2 and meta["tp"] == 2


def test_resume_same_layout_bitwise_other_layout_close(runs, tmp_path):
    one, four = runs
    same, other = tmp_path / "same", tmp_path / "other"
    seed_checkpoint(one, 3, same)
    seed_checkpoint(one, 3, other)
    procs = [(launch(1, same, *LORA), same), (launch(4, other, *LORA, "parallel.tp=2"), other)]
    for proc, run in procs:
        out = finish(proc, run)
        assert "resumed from" in out and "(step 3, saved under dp=1 x tp=1)" in out
    assert _losses(same, range(4, STEPS + 1)) == _losses(one, range(4, STEPS + 1))
    torch.testing.assert_close(
        torch.tensor(_losses(other, range(4, STEPS + 1))),
        torch.tensor(_losses(one, range(4, STEPS + 1))),
        rtol=1e-5,
        atol=0,
    )


def test_checkpoint_of_another_rank_is_refused_in_one_line(runs, tmp_path):
    one, _ = runs
    seed_checkpoint(one, 3, tmp_path)
    cmd = train_cmd(1, f"log.dir={tmp_path}", *LORA, "lora.r=8")
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train: error")]
    assert len(errors) == 1 and "lora.r 4 (saved) vs 8 (now)" in errors[0] and "Traceback" not in proc.stderr, (
        proc.stderr[-2000:]
    )
    assert (tmp_path / "checkpoints" / "step-00000003" / "meta.json").is_file(), "the checkpoint stays where it was"


def test_lora_on_a_mixture_of_experts_trains_the_adapters_alone(tmp_path):
    """LoRA on tiny-moe's attention projections under dp2 x tp2 with the experts split over ep=2 trains what one process
    trains: the adapters alone (tensor parallelism shards them with their bases in MoE layers too, and the experts that
    expert parallelism re-registers stay frozen), so the losses and the exported adapters are one process's."""
    moe = [
        *LORA,
        "model.shape=tiny-moe",
        "lora.target_modules=[q_proj,k_proj,v_proj,o_proj]",
        "steps=3",
        "checkpoint.interval=0",
    ]
    one, four = tmp_path / "one", tmp_path / "dp2tp2ep2"
    procs = [(launch(1, one, *moe), one), (launch(4, four, *moe, "parallel.tp=2", "parallel.ep=2"), four)]
    outs = [finish(proc, run) for proc, run in procs]
    trainable = [line for out in outs for line in out.splitlines() if "trainable parameters" in line]
    adapters = (
        2 * 4 * (64 + 64 + 64 + 32 + 64 + 32 + 64 + 64)
    )  # layers x r x (in + out) of q (64->64), k, v (64->32), o
    assert len(trainable) == 2 and trainable[0] == trainable[1] and f"{adapters:,} trainable" in trainable[0], trainable
    torch.testing.assert_close(
        torch.tensor(_losses(four, range(1, 4))), torch.tensor(_losses(one, range(1, 4))), rtol=1e-5, atol=0
    )
    a, b = load_file(one / "peft" / "adapter_model.safetensors"), load_file(four / "peft" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and len(a) == 2 * 4 * 2 and all(".self_attn." in k for k in a)
