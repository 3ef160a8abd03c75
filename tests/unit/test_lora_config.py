"""Bad LoRA input: one line naming the key and what is allowed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from train_helpers import TINY

from train.front.config import ConfigError, load_config


@pytest.mark.parametrize(
    "override, says",
    [
        ("lora.target_modules=[q_proj,x_proj]", "lora.target_modules: unknown module 'x_proj' (allowed: q_proj"),
        ("lora.r=0", "lora.r=0: Input should be greater than or equal to 1"),
        ("lora.quantize_base=nf4", "lora.quantize_base=nf4 needs lora.enabled=true"),
    ],
)
def test_bad_lora_settings_are_one_line(override, says):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(TINY, [override])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_lora_on_a_model_without_the_targets_is_one_line():
    from transformers import LlamaConfig, LlamaForCausalLM

    from train.adapters import apply_lora

    cfg = load_config(TINY, ["lora.enabled=true"]).lora
    with torch.device("meta"):
        model = LlamaForCausalLM(
            LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
        )
    model.model.layers[0].mlp.gate_proj = torch.nn.Identity()  # a layer without that projection
    with pytest.raises(
        ConfigError, match=r"^lora.target_modules: gate_proj is not a linear layer of decoder layer 0 \(it has: "
    ):
        apply_lora(model, cfg, torch.float32)


@pytest.mark.parametrize(
    "saved, current, says",
    [
        ({"r": 4, "target_modules": ["q_proj"]}, {"r": 8, "target_modules": ["q_proj"]}, "lora.r 4 (saved) vs 8 (now)"),
        (
            {"r": 4, "target_modules": ["q_proj"]},
            {"r": 4, "target_modules": ["v_proj"]},
            'lora.target_modules ["q_proj"] (saved) vs ["v_proj"] (now)',
        ),
        (
            {"r": 4, "base": {"path": "/a"}},
            {"r": 4, "base": {"path": "/b"}},
            'lora.base {"path": "/a"} (saved) vs {"path": "/b"} (now)',
        ),
        ({"r": 4}, None, "lora.r 4 (saved) vs null (now)"),
        (None, {"r": 4}, "lora.r null (saved) vs 4 (now)"),
    ],
)
def test_checkpoint_of_other_lora_settings_is_refused_in_one_line(tmp_path, saved, current, says):
    from train.resume import mismatch, written_with

    cfg = load_config(TINY, [])
    config = SimpleNamespace(vocab_size=2048)
    (tmp_path / "step-00000003").mkdir()
    (tmp_path / "step-00000003" / "meta.json").write_text(
        json.dumps({"step": 3, "written_with": written_with(cfg, config, saved)})
    )
    refusal = mismatch([tmp_path / "step-00000003"], written_with(cfg, config, current))
    assert says in refusal and "\n" not in refusal
    assert mismatch([tmp_path / "step-00000003"], written_with(cfg, config, saved)) is None  # the same settings resume


def test_qlora_on_several_ranks_is_one_line():
    from train.front.layout import WorldEnv
    from train.front.run_check import check_run

    cfg = load_config(TINY, ["lora.enabled=true", "lora.quantize_base=nf4"])
    with pytest.raises(
        ConfigError, match=r"^lora.quantize_base=nf4 trains on one rank \(one GPU\); this job has WORLD_SIZE=4: "
    ):
        check_run(cfg, WorldEnv(rank=0, local_rank=0, world_size=4, local_world_size=4))
    with pytest.raises(ConfigError, match="lora.quantize_base=nf4 and fp8.enabled=true exclude each other"):
        load_config(TINY, ["lora.enabled=true", "lora.quantize_base=nf4", "fp8.enabled=true"])


@pytest.mark.parametrize(
    "config",
    [
        {
            "model_type": "qwen3",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 24,
        },
        {
            "model_type": "qwen3",
            "hidden_size": 48,
            "intermediate_size": 80,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
        },
        {
            "model_type": "qwen3_moe",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
        },
        {
            "model_type": "qwen3_moe",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "mlp_only_layers": [2],
            "decoder_sparse_step": 2,
        },
    ],
    ids=["qwen3", "qwen3-library-head-dim", "qwen3-moe", "qwen3-moe-dense-layers"],
)
def test_decoder_linears_are_the_linear_layers_transformers_builds(config, tmp_path):
    """train.front.run_check's table of a decoder layer's linear layers (names and shapes, from a config.json's
    fields over transformers' defaults) is what transformers builds, and what the trainer's own MoE model (which
    apply_lora wraps) has."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from train.front.run_check import decoder_linears, model_dims
    from train.model import build_meta_model

    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text("{}")
    cfg = load_config(TINY, ["model.shape=null", f"model.path={tmp_path}"])
    hf = AutoConfig.from_pretrained(tmp_path)
    dims = model_dims(cfg)
    hf.save_pretrained(tmp_path)  # as transformers writes it (an export, num_local_experts): the same layers
    saved = model_dims(load_config(TINY, ["model.shape=null", f"model.path={tmp_path}"]))
    assert all(decoder_linears(saved, i) == decoder_linears(dims, i) for i in range(hf.num_hidden_layers))
    with torch.device("meta"):
        theirs = AutoModelForCausalLM.from_config(hf)
    for model in (theirs, build_meta_model(hf)):
        for i, layer in enumerate(model.model.layers):
            have = {
                name.rsplit(".", 1)[-1]: tuple(m.weight.shape)
                for name, m in layer.named_modules()
                if isinstance(m, torch.nn.Linear)
            }
            assert have == decoder_linears(dims, i), (type(model).__name__, i)


def test_library_defaults_are_transformers_defaults():
    from transformers import Qwen3Config, Qwen3MoeConfig

    from train.front.run_check import LIBRARY_DEFAULTS

    for name, cls in (("qwen3", Qwen3Config), ("qwen3_moe", Qwen3MoeConfig)):
        ours, theirs = LIBRARY_DEFAULTS[name], cls()
        assert {k: getattr(theirs, k) for k in ours} == ours, name
