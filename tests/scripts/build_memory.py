"""How much host memory building a model takes on each rank, against what it keeps.

    torchrun --nproc-per-node N build_memory.py --out FILE [--qlora] [--hidden 512]

Builds a 16-layer Qwen3 (about 200 MB in fp32 at hidden 512) on the meta device, parallelizes it over N ranks (FSDP2 on
CPU, gloo) or,
with --qlora, on one rank with LoRA on every projection and an NF4 base, then fills it with the seeded initial weights.
Each rank writes: the growth of its peak resident memory while filling (ru_maxrss), the bytes of the parameters it
holds after, the largest single tensor and the whole model in fp32.
"""

from __future__ import annotations

import argparse
import json
import resource

import torch
import torch.distributed as dist
from transformers import Qwen3Config

from train.adapters import LoraLinear, nf4_api
from train.front.config import LoraConfig, ModelConfig, ParallelConfig
from train.model import build_meta_model, load_initial_weights
from train.parallel import ParallelDims, WorldEnv, build_mesh, parallelize

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of this rank's parameters (local shards; an NF4 weight's packed data and scales)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        inner = (
            [getattr(local, n) for n in local.__tensor_flatten__()[0]]
            if hasattr(local, "__tensor_flatten__")
            else [local]
        )
        total += sum(t.numel() * t.element_size() for t in inner)
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--qlora", action="store_true")
    p.add_argument("--hidden", type=int, default=512)
    a = p.parse_args()
    dist.init_process_group("gloo")
    env = WorldEnv.from_env()
    config = Qwen3Config(
        vocab_size=2048,
        hidden_size=a.hidden,
        intermediate_size=3 * a.hidden,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=a.hidden // 8,
        tie_word_embeddings=False,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    model = build_meta_model(config)
    largest = max(p.numel() * 4 for p in model.parameters())
    whole = sum(p.numel() * 4 for p in model.parameters())
    mesh = build_mesh(ParallelDims.build(ParallelConfig(), env, kv_heads=4), torch.device("cpu"))
    lora = LoraConfig(enabled=True, r=8, alpha=16, target_modules=TARGETS, quantize_base="nf4") if a.qlora else None
    model = parallelize(
        model, mesh, activation_checkpointing=False, compile=False, param_dtype=torch.float32, lora=lora
    )
    if a.qlora:
        nf4_api()  # torchao imported before, as the trainer's check does
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    load_initial_weights(model, ModelConfig(shape="tiny"), config, seed=0, device=torch.device("cpu"), nf4=a.qlora)
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    wrapped = sum(isinstance(m, LoraLinear) for m in model.modules())
    with open(f"{a.out}.{env.rank}", "w") as f:
        json.dump(
            {"growth": growth, "held": held_bytes(model), "largest": largest, "whole": whole, "wrapped": wrapped}, f
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
