"""Building a model tensor by tensor: the seeded init follows transformers' own init of Qwen3 and Qwen3-MoE, tensor
for tensor, and a QLoRA base is quantized as each projection arrives, from a shape or from a Hugging Face directory."""

import pytest
import torch
from train_helpers import FP8_SITE
from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

from train.adapters import LoraLinear, apply_lora
from train.data.tokenizer import load_tokenizer
from train.front.config import LoraConfig, ModelConfig
from train.model import build_meta_model, hf_config, initial_value, load_initial_weights

CPU = torch.device("cpu")


def _config(shape: str, **dims):
    return hf_config(ModelConfig(shape=shape, dims=dims), load_tokenizer(None))


@pytest.mark.parametrize("shape", ["tiny", "tiny-moe"])
def test_seeded_init_is_transformers_init_tensor_for_tensor(shape, one_rank):
    """Every weight of the model built here is drawn as transformers initializes the same weight of its own model:
    constant ones where it puts ones, else mean 0 and std initializer_range (both measured on the tensors)."""
    config = _config(shape, hidden_size=128, intermediate_size=256)
    torch.manual_seed(0)
    ref = (Qwen3MoeForCausalLM if shape == "tiny-moe" else Qwen3ForCausalLM)(config).state_dict()
    model = build_meta_model(config)
    load_initial_weights(model, ModelConfig(shape=shape), config, seed=3, device=CPU)
    ours = model.state_dict()
    assert ours.keys() == {k for k in ref if "rotary" not in k}
    for name, want in ref.items():
        if "rotary" in name:
            continue
        got = ours[name]
        if torch.all(want == 1):
            assert torch.all(got == 1), name
        else:
            assert abs(got.std().item() - want.std().item()) < 0.15 * want.std().item(), name
            assert abs(got.mean().item()) < 0.1 * want.std().item(), name


def test_seeded_init_is_the_same_in_any_order_and_differs_by_seed(one_rank):
    """A tensor's value depends only on the seed and its name: built twice it is equal, with another seed it is not."""
    config = _config("tiny")
    a, b, c = (build_meta_model(config) for _ in range(3))
    for model, seed in ((a, 1), (b, 1), (c, 2)):
        load_initial_weights(model, ModelConfig(shape="tiny"), config, seed=seed, device=CPU)
    name = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(a.state_dict()[name], b.state_dict()[name])
    assert not torch.equal(a.state_dict()[name], c.state_dict()[name])
    assert torch.equal(a.state_dict()[name], initial_value(name, (192, 64), config.initializer_range, 1, CPU))


@pytest.fixture
def nf4(monkeypatch):
    monkeypatch.syspath_prepend(str(FP8_SITE))
    from train.adapters import nf4_api

    return nf4_api()


def _qlora(config, cfg: ModelConfig, targets=("q_proj", "down_proj"), seed: int = 0):
    model = build_meta_model(config)
    apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8, target_modules=list(targets)), torch.float32)
    load_initial_weights(model, cfg, config, seed=seed, device=CPU, nf4=True)
    return model


def test_qlora_base_is_quantized_as_it_arrives_from_a_shape(nf4, one_rank):
    """Each target projection's base is the NF4 of the seeded init (torchao's to_nf4 of the same tensor); every other
    weight is the seeded init itself; nothing is left on the meta device."""
    NF4Tensor, to_nf4 = nf4
    config = _config("tiny")
    model = _qlora(config, ModelConfig(shape="tiny"))
    assert not any(p.is_meta for p in model.parameters())
    wrapped = [m for m in model.modules() if isinstance(m, LoraLinear)]
    assert len(wrapped) == 2 * config.num_hidden_layers
    q = model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert isinstance(q, NF4Tensor) and not q.requires_grad
    expected = to_nf4(
        initial_value("model.layers.0.self_attn.q_proj.weight", tuple(q.shape), config.initializer_range, 0, CPU),
        64,
        64,
    )
    assert torch.equal(q.get_original_weight(), expected.get_original_weight())
    k = model.model.layers[0].self_attn.k_proj.weight
    assert torch.equal(
        k, initial_value("model.layers.0.self_attn.k_proj.weight", tuple(k.shape), config.initializer_range, 0, CPU)
    )
    assert torch.all(model.model.layers[1].input_layernorm.weight == 1)


def test_qlora_base_is_quantized_as_it_arrives_from_a_directory(nf4, one_rank, tmp_path):
    """From model.path: the bases are the NF4 of the files' weights, the rest the files' weights (MoE experts fused from
    the files' per-expert tensors); the forward equals transformers' model with its targets' weights dequantized."""
    NF4Tensor, to_nf4 = nf4
    config = _config("tiny-moe", vocab_size=2048)
    torch.manual_seed(4)
    ref = Qwen3MoeForCausalLM(config).float()
    ref.save_pretrained(tmp_path)
    model = _qlora(config, ModelConfig(path=str(tmp_path)), targets=("q_proj", "o_proj"))
    assert isinstance(model.model.layers[1].self_attn.o_proj.base_layer.weight, NF4Tensor)
    with torch.no_grad():
        for name, module in ref.named_modules():
            if name.endswith(("q_proj", "o_proj")):
                module.weight.copy_(to_nf4(module.weight, 64, 64).get_original_weight())
    ids = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-5)
