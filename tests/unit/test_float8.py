"""FP8 training (train/float8.py) on CPU: the one-line errors, which modules become float8, and an emulated float8 step
(float8 rounding, high-precision products) against the same model in full precision."""

from __future__ import annotations

import sys

import pytest
import torch
from train_helpers import FP8_SITE, TINY
from transformers import Qwen3Config, Qwen3ForCausalLM

from train.front.config import ConfigError, load_config

sys.path.insert(0, str(FP8_SITE))


PROJECTIONS = {
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
}


def _tiny_model(**dims) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        **{
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 192,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "tie_word_embeddings": False,
            **dims,
        }
    )
    return Qwen3ForCausalLM(config)


def test_fp8_needs_bf16_compute():
    with pytest.raises(ConfigError, match="fp8.enabled=true needs bf16 compute"):
        load_config(TINY, ["fp8.enabled=true", "dtype=fp32"])
    assert load_config(TINY, ["fp8.enabled=true", "fp8.recipe=rowwise"]).fp8.recipe == "rowwise"


@pytest.mark.parametrize("recipe, all_gather", [("tensorwise", True), ("tensorwise", False), ("rowwise", False)])
def test_only_the_decoder_projections_become_float8(recipe, all_gather, torchao_float8):
    float8 = torchao_float8
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    from train.float8 import convert_decoder_linears

    with torch.device("meta"):
        model = _tiny_model()
    names = convert_decoder_linears(model.model.layers, recipe, float8_all_gather=all_gather)
    assert sorted(names) == sorted(f"{i}.{p}" for i in range(2) for p in PROJECTIONS)
    converted = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert converted == {f"model.layers.{n}" for n in names}
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.embed_tokens) is torch.nn.Embedding
    gathered = {name for name, p in model.named_parameters() if isinstance(p, WeightWithDynamicFloat8CastTensor)}
    assert gathered == ({f"model.layers.{n}.weight" for n in names} if all_gather else set())
    assert float8.Float8LinearConfig.from_recipe_name(recipe)  # the recipe names the config accepts


def test_linears_whose_dims_are_not_multiples_of_16_stay(torchao_float8):
    from train.float8 import convert_decoder_linears

    with torch.device("meta"):
        model = _tiny_model(intermediate_size=200)  # gate/up 64 -> 200, down 200 -> 64
    names = convert_decoder_linears(model.model.layers, "tensorwise", float8_all_gather=False)
    assert sorted(names) == sorted(f"{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo")


def test_emulated_float8_step_tracks_full_precision(torchao_float8):
    """Same weights and batch: the float8 model's loss and gradients stay close to the fp32 model's, and are not equal
    to them."""
    from train.float8 import convert_decoder_linears

    ref, fp8 = _tiny_model(), _tiny_model()
    convert_decoder_linears(fp8.model.layers, "tensorwise", float8_all_gather=False, emulate=True)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    losses, grads = [], []
    for model in (ref, fp8):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in model.model.layers.parameters()]))
    assert abs(losses[0] - losses[1]) < 0.01 * losses[0]
    assert losses[0] != losses[1]
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99


def test_with_lora_only_the_frozen_bases_become_float8(torchao_float8):
    from torchao.float8.float8_linear import Float8Linear

    from train.adapters import apply_lora
    from train.float8 import convert_decoder_linears

    with torch.device("meta"):
        model = _tiny_model()
    apply_lora(model, load_config(TINY, ["lora.enabled=true", "lora.r=16"]).lora, torch.float32)
    names = convert_decoder_linears(model.model.layers, "tensorwise", float8_all_gather=False, only_frozen=True)
    assert sorted(names) == sorted(f"{i}.{p}.base_layer" for i in range(2) for p in PROJECTIONS)
    assert not any(isinstance(m, Float8Linear) for n, m in model.named_modules() if ".lora_" in n)
