"""Bad LoRA input: one line naming the key and what is allowed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from train.config import ConfigError, load_config
from train_helpers import TINY


@pytest.mark.parametrize("override, says", [
    ("lora.target_modules=[q_proj,x_proj]", "lora.target_modules: unknown module 'x_proj' (allowed: q_proj"),
    ("lora.r=0", "lora.r=0: Input should be greater than or equal to 1"),
    ("lora.quantize_base=nf4", "lora.quantize_base=nf4 needs lora.enabled=true"),
])
def test_bad_lora_settings_are_one_line(override, says):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(TINY, [override])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_lora_on_a_model_without_the_targets_is_one_line():
    from transformers import LlamaConfig, LlamaForCausalLM

    from train.adapters import apply_lora

    cfg = load_config(TINY, ["lora.enabled=true"]).lora
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64))
    model.model.layers[0].mlp.gate_proj = torch.nn.Identity()  # a layer without that projection
    with pytest.raises(ConfigError, match=r"^lora.target_modules: gate_proj is not a linear layer of decoder layer 0 \(it has: "):
        apply_lora(model, cfg, torch.float32)


@pytest.mark.parametrize("saved, current, says", [
    ({"r": 4, "target_modules": ["q_proj"]}, {"r": 8, "target_modules": ["q_proj"]}, "lora.r 4 (saved) vs 8 (now)"),
    ({"r": 4, "target_modules": ["q_proj"]}, {"r": 4, "target_modules": ["v_proj"]}, 'lora.target_modules ["q_proj"] (saved) vs ["v_proj"] (now)'),
    ({"r": 4, "base": {"path": "/a"}}, {"r": 4, "base": {"path": "/b"}}, 'lora.base {"path": "/a"} (saved) vs {"path": "/b"} (now)'),
    ({"r": 4}, None, "lora.r 4 (saved) vs null (now)"),
    (None, {"r": 4}, "lora.r null (saved) vs 4 (now)"),
])
def test_checkpoint_of_other_lora_settings_is_refused_in_one_line(tmp_path, saved, current, says):
    from train.resume import mismatch, written_with

    cfg = load_config(TINY, [])
    config = SimpleNamespace(vocab_size=2048)
    (tmp_path / "step-00000003").mkdir()
    (tmp_path / "step-00000003" / "meta.json").write_text(json.dumps({"step": 3, "written_with": written_with(cfg, config, saved)}))
    refusal = mismatch([tmp_path / "step-00000003"], written_with(cfg, config, current))
    assert says in refusal and "\n" not in refusal
    assert mismatch([tmp_path / "step-00000003"], written_with(cfg, config, saved)) is None  # the same settings resume


def test_qlora_on_several_ranks_is_one_line():
    from train.adapters import check_layout

    cfg = load_config(TINY, ["lora.enabled=true", "lora.quantize_base=nf4"]).lora
    with pytest.raises(ConfigError, match=r"^lora.quantize_base=nf4 trains on one rank \(one GPU\); this job has WORLD_SIZE=4: "):
        check_layout(cfg, 4)
    with pytest.raises(ConfigError, match="lora.quantize_base=nf4 and fp8.enabled=true exclude each other"):
        load_config(TINY, ["lora.enabled=true", "lora.quantize_base=nf4", "fp8.enabled=true"])
