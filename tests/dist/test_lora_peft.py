"""LoRA against PEFT, the independent oracle: from the same HF base and the same initial A and B, the trainer's LoRA
and PEFT's LoRA on the plain transformers model (fp32, CPU, one process) give the same losses over 20 steps; the
exported adapter directory loads with ``peft.PeftModel.from_pretrained`` and gives the trainer's logits; the merged
export loads with AutoModelForCausalLM; the checkpoint holds only the adapters and their AdamW state."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import peft
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from train_helpers import FP8_SITE, TINY, metrics, save_tiny_hf
from transformers import AutoModelForCausalLM

from train.adapters import PEFT_PREFIX, is_adapter_key
from train.data.tokenizer import load_tokenizer
from train.front.config import load_config
from train.front.data_sources import DEMO_CORPUS
from train.front.tokenizer import DEMO_TOKENIZER_DIR
from train.generate import generate
from train.loop import Trainer, lr_at
from train.parallel import ParallelDims, WorldEnv, init_distributed

STEPS, R, ALPHA = 20, 8, 16.0


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    out = save_tiny_hf(tmp_path_factory.mktemp("hf") / "qwen3", seed=5)
    with DEMO_CORPUS.open() as f:  # each trainer tokenizes its data: a short text is enough here
        (out.parent / "text.jsonl").write_text(json.dumps({"text": json.loads(next(f))["text"][:60_000]}) + "\n")
    return out


@contextlib.contextmanager
def lora_trainer(run_dir, base, *overrides):
    """A one-process LoRA Trainer in this process (fp32, CPU) on the HF directory ``base``."""
    text = Path(base).parent / "text.jsonl"
    cfg = load_config(
        TINY,
        [
            "model.shape=null",
            f"model.path={base}",
            f"data.path={text}",
            "dtype=fp32",
            f"steps={STEPS}",
            "log.log_every=1",
            f"log.dir={run_dir}",
            "checkpoint.interval=0",
            "export=peft",
            "lora.enabled=true",
            f"lora.r={R}",
            f"lora.alpha={ALPHA}",
            "optim.lr=1e-2",
            *overrides,
        ],
    )
    env = WorldEnv(0, 0, 1, 1)
    device = init_distributed(env)
    try:
        yield Trainer(cfg, ParallelDims.build(cfg.parallel, env, cfg.model.kv_heads()), env, device, run_id="test")
    finally:
        dist.destroy_process_group()


@pytest.fixture
def trainer(tmp_path, hf_base, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with lora_trainer(tmp_path, hf_base, "lora.merge=true") as t:
        yield t


def _peft_model(hf_base, adapters: dict[str, torch.Tensor]):
    base = AutoModelForCausalLM.from_pretrained(hf_base, dtype=torch.float32)
    model = peft.get_peft_model(
        base,
        peft.LoraConfig(
            r=R,
            lora_alpha=ALPHA,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )
    state = {PEFT_PREFIX + k.replace(".weight", ".default.weight"): v for k, v in adapters.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if "lora_" in k]
    return model


def test_trainer_lora_equals_peft_lora_for_20_steps_and_exports_for_peft(trainer, hf_base, tmp_path):
    cfg = trainer.cfg
    initial = {k: v.detach().clone() for k, v in trainer.model.state_dict().items() if is_adapter_key(k)}
    assert len(initial) == 2 * 7 * 2 and all(v.abs().sum() == 0 for k, v in initial.items() if "lora_B" in k)
    start = trainer.stream.state_dict()
    batches = [trainer.stream.next_microbatches() for _ in range(STEPS)]
    trainer.stream.load_state_dict(start)

    # the oracle: PEFT on transformers' model, the trainer's optimizer settings, schedule, clipping and loss
    # normalization
    model = _peft_model(hf_base, initial)
    params = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in params) == sum(v.numel() for v in initial.values())
    o = cfg.optim
    opt = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, foreach=False)
    expected = []
    for step, micro in enumerate(batches, 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, o.lr, cfg.schedule.warmup_steps, cfg.schedule.min_lr, cfg.steps)
        tokens = sum((labels != -100).sum() for _, labels in micro)
        total = 0.0
        for input_ids, labels in micro:
            logits = model(input_ids=input_ids).logits
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
            (loss / tokens).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad()
        expected.append(total / tokens.item())

    assert trainer.run() == STEPS
    got = [metrics(tmp_path)[s]["loss"] for s in range(1, STEPS + 1)]
    assert got[-1] < got[0] - 0.05, "the adapters learn"
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=2e-6, atol=0)

    # export: PEFT loads the adapter directory onto the HF base and gives the trainer's logits
    export = tmp_path / "peft"
    adapter_cfg = json.loads((export / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == R and adapter_cfg["lora_alpha"] == ALPHA and len(adapter_cfg["target_modules"]) == 7
    from safetensors import safe_open

    with safe_open(export / "adapter_model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys and len(keys) == 28
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_base, dtype=torch.float32), export)
    ids = batches[0][0][0]
    with torch.no_grad():
        ours = trainer.model(input_ids=ids).logits
        torch.testing.assert_close(loaded(input_ids=ids).logits, ours, rtol=1e-5, atol=1e-5)
        merged = AutoModelForCausalLM.from_pretrained(export / "merged", dtype=torch.float32)
        torch.testing.assert_close(merged(input_ids=ids).logits, ours, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(
            AutoModelForCausalLM.from_pretrained(hf_base, dtype=torch.float32)(input_ids=ids).logits, ours, atol=1e-3
        )
    # train.generate loads the adapter directory onto its base (adapter_config.json's base_model_name_or_path)
    assert adapter_cfg["base_model_name_or_path"] == str(hf_base)
    assert generate(export, "ROMEO:", tokens=8) == generate(export / "merged", "ROMEO:", tokens=8)

    # the checkpoint: adapters + their AdamW state, no base weight
    ckpt = tmp_path / "checkpoints" / f"step-{STEPS:08d}"
    saved = dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(is_adapter_key(k) for k in model_keys)
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["written_with"]["lora.r"] == R and meta["written_with"]["lora.base"] == {"path": str(hf_base.resolve())}


def test_qlora_nf4_base_trains_like_lora_on_the_dequantized_base(tmp_path, hf_base, monkeypatch):
    """QLoRA on the base W equals LoRA on the fp32 base dequant(NF4(W)) (torchao's NF4, CPU): the NF4 base enters only
    through its dequantized products; it holds ~1/7 of the fp32 bytes; the checkpoint holds no base."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.syspath_prepend(str(FP8_SITE))
    from train.adapters import nf4_api, nf4_scaler_block

    NF4Tensor, to_nf4 = nf4_api()

    dequant = tmp_path / "dequant"
    model = AutoModelForCausalLM.from_pretrained(hf_base, dtype=torch.float32)
    with torch.no_grad():
        for name, m in model.model.layers.named_modules():
            if name.endswith("_proj"):
                m.weight.copy_(to_nf4(m.weight, 64, nf4_scaler_block(m.weight.numel())).get_original_weight())
    model.save_pretrained(dequant)
    (tmp_path / "text.jsonl").write_text((hf_base.parent / "text.jsonl").read_text())
    load_tokenizer(str(DEMO_TOKENIZER_DIR)).save_pretrained(dequant)

    losses = {}
    for name, base, extra in (("qlora", hf_base, ["lora.quantize_base=nf4"]), ("lora", dequant, [])):
        with lora_trainer(tmp_path / name, base, "steps=6", *extra) as t:
            if name == "qlora":
                nf4 = [p for p in t.model.parameters() if isinstance(p, NF4Tensor)]
                assert len(nf4) == 14
                packed = sum(
                    p.quantized_data.numel() + p.quantized_scalers.numel() + 4 * p.quantization_factor.numel()
                    for p in nf4
                )
                assert packed < sum(p.numel() for p in nf4) * 4 / 7
            t.run()
        losses[name] = [metrics(tmp_path / name)[s]["loss"] for s in range(1, 7)]
    torch.testing.assert_close(torch.tensor(losses["qlora"]), torch.tensor(losses["lora"]), rtol=1e-6, atol=0)
    saved = (
        dcp.FileSystemReader(tmp_path / "qlora" / "checkpoints" / "step-00000006").read_metadata().state_dict_metadata
    )
    assert all(is_adapter_key(k) for k in saved if k.startswith("model."))
