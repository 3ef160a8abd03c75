"""Grouped experts against transformers' Qwen3-MoE: the same logits, load-balancing loss and gradients from the same
weights; HF in (per-expert safetensors) and out (AutoModelForCausalLM loads the export, same logits)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from train.data.tokenizer import load_tokenizer
from train.front.config import ModelConfig
from train.model import build_meta_model, count_params, export_hf, hf_config, load_initial_weights
from train.moe import Qwen3MoeForTraining, grouped_mlp, load_imbalance, looped_mlp, routing_summary


def _config(**over) -> Qwen3MoeConfig:
    dims = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        sliding_window=None,
    )
    return Qwen3MoeConfig(**(dims | over))


def _pair(config: Qwen3MoeConfig, seed: int = 0) -> tuple[Qwen3MoeForCausalLM, Qwen3MoeForTraining]:
    torch.manual_seed(seed)
    ref = Qwen3MoeForCausalLM(config).float()
    ours = Qwen3MoeForTraining(config).float()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


@pytest.mark.parametrize("over", [{}, {"norm_topk_prob": False, "num_experts_per_tok": 3}, {"mlp_only_layers": [0]}])
def test_logits_match_transformers(over):
    ref, ours = _pair(_config(**over))
    ids = torch.randint(0, 256, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = ref(input_ids=ids).logits, ours(input_ids=ids).logits
    assert torch.allclose(got, expected, rtol=0, atol=1e-5), (got - expected).abs().max()


def test_loss_aux_and_gradients_match_transformers():
    """HF's loss with output_router_logits (cross-entropy + coef x load-balancing loss) against ours, term and
    gradient."""
    config = _config(router_aux_loss_coef=0.05)
    ref, ours = _pair(config, seed=2)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
    out = ref(input_ids=ids, labels=ids, output_router_logits=True)
    out.loss.backward()
    next_tokens = torch.cat(
        [ids[:, 1:], torch.full((2, 1), -100)], dim=1
    )  # HF shifts inside; the trainer's labels come shifted
    ce = ours(input_ids=ids, labels=next_tokens)
    aux, counts = routing_summary(ours)
    (ce + config.router_aux_loss_coef * aux).backward()
    assert abs(aux.item() - out.aux_loss.item()) < 1e-6
    assert counts.shape == (2, 8) and torch.all(counts.sum(1) == 2 * 32 * 2)
    assert load_imbalance(counts).item() == max((c.max() / c.mean()).item() for c in counts)
    grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.allclose(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6), name
    assert grads["model.layers.0.mlp.gate.weight"].grad.abs().sum() > 0


def test_grouped_mm_equals_the_loop():
    """The CUDA path's grouped product (torch._grouped_mm also runs on CPU) gives the CPU loop's result, empty experts
    too."""
    g = torch.Generator().manual_seed(4)
    counts = torch.tensor([5, 0, 7, 1])
    x, gate_up, down = (
        torch.randn(13, 16, generator=g),
        torch.randn(4, 24, 16, generator=g),
        torch.randn(4, 16, 12, generator=g),
    )
    assert torch.allclose(
        grouped_mlp(x, gate_up, down, counts, F.silu), looped_mlp(x, gate_up, down, counts, F.silu), atol=1e-5
    )


def test_active_parameters_of_the_released_shapes():
    """30B-A3B and 235B-A22B: the counts their model cards state (30.5B total / 3.3B activated, 235B / 22B)."""
    tok = load_tokenizer(None)
    p30 = count_params(hf_config(ModelConfig(shape="30B-A3B"), tok))
    p235 = count_params(hf_config(ModelConfig(shape="235B-A22B"), tok))
    active = {
        n: (p["active_non_embedding"] + p["embedding"] + p["lm_head"]) / 1e9 for n, p in (("30B", p30), ("235B", p235))
    }
    assert round(p30["total"] / 1e9, 1) == 30.5 and abs(active["30B"] - 3.3) < 0.1, active
    assert round(p235["total"] / 1e9) == 235 and abs(active["235B"] - 22) < 0.5, active


def test_hf_directory_in_and_export_out(tmp_path, one_rank):
    """model.path reads the released per-expert layout into the fused experts; the export writes that layout back and
    AutoModelForCausalLM.from_pretrained gives the same logits."""
    tok = load_tokenizer(None)
    torch.manual_seed(5)
    ref = Qwen3MoeForCausalLM(_config(vocab_size=2048, tie_word_embeddings=False)).float()
    ref.save_pretrained(tmp_path / "hf")
    cfg = ModelConfig(path=str(tmp_path / "hf"))
    config = hf_config(cfg, tok)
    model = build_meta_model(config)
    load_initial_weights(model, cfg, config, seed=0, device=torch.device("cpu"))
    ids = torch.randint(0, 2048, (2, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = ref(input_ids=ids).logits
        assert torch.allclose(model(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
    export_hf(model, config, tok, tmp_path / "export")
    with safe_open(tmp_path / "export" / "model.safetensors", "pt") as f:
        assert "model.layers.1.mlp.experts.7.up_proj.weight" in f.keys() and not any(
            "gate_up_proj" in k for k in f.keys()
        )
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    assert isinstance(loaded, Qwen3MoeForCausalLM)
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected, rtol=0, atol=1e-5)


def test_ep_errors_are_one_line_before_any_process_group():
    from train.front.config import ConfigError, ParallelConfig
    from train.parallel import ParallelDims, WorldEnv

    env = WorldEnv(rank=0, local_rank=0, world_size=4, local_world_size=4)
    with pytest.raises(
        ConfigError, match=r"^parallel.ep=2 needs a mixture-of-experts model .* this one is dense: use parallel.ep=1$"
    ):
        ParallelDims.build(ParallelConfig(ep=2), env, kv_heads=2, num_experts=0)
    with pytest.raises(
        ConfigError,
        match=r"parallel.ep=3 must divide parallel.dp=4 and the model's num_experts=8 \(allowed: \[1, 2, 4\]\)",
    ):
        ParallelDims.build(ParallelConfig(ep=3), env, kv_heads=2, num_experts=8)
    with pytest.raises(
        ConfigError,
        match=r"parallel.ep=4 must divide parallel.dp=2 and the model's num_experts=6 \(allowed: \[1, 2\]\)",
    ):
        ParallelDims.build(ParallelConfig(ep=4, tp=2), env, kv_heads=2, num_experts=6)
    assert ParallelDims.build(ParallelConfig(ep=2, tp=2), env, kv_heads=2, num_experts=8) == ParallelDims(
        dp=2, tp=2, ep=2
    )
    assert ModelConfig(shape="tiny").num_experts() == 0 and ModelConfig(shape="tiny-moe").num_experts() == 8


@pytest.mark.parametrize(
    "saved_top_k, saved_norm, says",
    [
        (2, True, None),
        (4, True, "model.dims.num_experts_per_tok 4 (saved) vs 2 (now)"),
        (2, False, "model.dims.norm_topk_prob false (saved) vs true (now)"),
        ("unrecorded", None, None),
    ],
)
def test_a_checkpoint_of_other_routing_is_refused_like_other_dims(tmp_path, saved_top_k, saved_norm, says):
    """Routing decides what the experts' weights mean: a checkpoint written with another top-k or top-k normalization is
    refused in one line; one written before routing was recorded (no such keys) resumes."""
    import json

    from train_helpers import TINY

    from train.front.config import load_config
    from train.resume import mismatch, written_with

    cfg = load_config(TINY, ["model.shape=tiny-moe"])
    config = hf_config(cfg.model, load_tokenizer(None))
    saved = written_with(cfg, config, None)
    if saved_top_k == "unrecorded":
        saved = {
            k: v for k, v in saved.items() if k not in ("model.dims.num_experts_per_tok", "model.dims.norm_topk_prob")
        }
    else:
        saved |= {"model.dims.num_experts_per_tok": saved_top_k, "model.dims.norm_topk_prob": saved_norm}
    (tmp_path / "step-00000004").mkdir()
    (tmp_path / "step-00000004" / "meta.json").write_text(json.dumps({"step": 4, "written_with": saved}))
    refusal = mismatch([tmp_path / "step-00000004"], written_with(cfg, config, None))
    assert refusal is None if says is None else (says in refusal and "\n" not in refusal), refusal
