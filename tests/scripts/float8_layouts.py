"""Emulated float8 (CPU, gloo) through the trainer's parallelize order under a dp x tp layout.

    torchrun --nproc-per-node N float8_layouts.py --tp T --out FILE

Builds the tiny Qwen3 on the meta device, converts the decoder linears to float8 (tensorwise,
emulated; float8 all-gather where dp > 1), then tensor parallel and FSDP2 exactly as
``train.parallel.parallelize`` orders them, loads the seeded initial weights and takes two
AdamW steps on a fixed batch, the weights' float8 scales precomputed after each as the trainer does. Rank 0 writes the
losses and the float8 module count to FILE.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from transformers import Qwen3Config

from train.float8 import convert_decoder_linears, precompute_weight_scales
from train.front.config import ModelConfig, ParallelConfig
from train.front.layout import DP
from train.model import build_meta_model, load_initial_weights
from train.parallel import ParallelDims, WorldEnv, build_mesh, parallelize


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dist.init_process_group("gloo")
    env = WorldEnv.from_env()
    dims = ParallelDims.build(ParallelConfig(tp=a.tp), env, kv_heads=2)
    mesh = build_mesh(dims, torch.device("cpu"))
    config = Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    model = build_meta_model(config)
    names = convert_decoder_linears(model.model.layers, "tensorwise", float8_all_gather=dims.dp > 1, emulate=True)
    model = parallelize(model, mesh, activation_checkpointing=False, compile=False, param_dtype=torch.float32)
    load_initial_weights(model, ModelConfig(shape="tiny"), config, seed=0, device=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(0, 256, (2 * dims.dp, 32), generator=torch.Generator().manual_seed(1))
    dp_rank = mesh[DP].get_local_rank()
    local = ids.chunk(dims.dp)[dp_rank]  # each dp rank its share of the batch
    losses = []
    for _ in range(2):
        logits = model(input_ids=local).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), local.roll(-1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        precompute_weight_scales(model)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dims.dp / dims.tp)
    if env.rank == 0:
        with open(a.out, "w") as f:
            json.dump({"losses": losses, "float8_modules": len(names), "dp": dims.dp, "tp": dims.tp}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
