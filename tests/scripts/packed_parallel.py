"""Packed rows under dp2 x tp2 (FSDP2 + tensor parallel, gloo on CPU) against their samples run one by one.

    torchrun --standalone --nproc-per-node 4 packed_parallel.py

Each dp rank takes one packed row of tiny-Qwen3 tokens; the loss is the sum over the global batch's loss tokens
divided by their global count (times dp, which FSDP divides by). Every rank also runs all samples of both rows one
by one on an unsharded copy of the same weights and checks the loss and every gathered gradient (fp32).
Prints one line on rank 0 with the largest differences; exits 1 on a mismatch.
"""

import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.tensor import DTensor
from transformers import Qwen3Config

from train.data.formats import Sample
from train.data.packing import IGNORE, START, TARGET, model_inputs, pack
from train.front.layout import DP
from train.model import build_meta_model, materialize
from train.parallel import ParallelDims, build_mesh, parallelize

SEQ = 32


def summed_loss(model, x, y, p):
    return F.cross_entropy(
        model(input_ids=x, position_ids=p).logits.flatten(0, 1).float(),
        y.flatten(),
        ignore_index=IGNORE,
        reduction="sum",
    )


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dims = ParallelDims(dp=2, tp=2)
    mesh = build_mesh(dims, torch.device("cpu"))
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    reference = build_meta_model(config)
    materialize(reference, config, torch.device("cpu"))
    torch.manual_seed(0)
    reference.apply(reference._init_weights)
    model = parallelize(
        build_meta_model(config), mesh, activation_checkpointing=False, compile=False, param_dtype=torch.float32
    )
    materialize(model, config, torch.device("cpu"))
    set_model_state_dict(model, reference.state_dict(), options=StateDictOptions(full_state_dict=True))

    rng = np.random.default_rng(0)
    samples = []
    for n in (11, 9, 7, 13, 6, 12):
        targets = rng.random(n) < 0.6
        targets[0] = False
        samples.append(Sample(rng.integers(1, 64, n).astype(np.int32), targets))
    tokens, flags, stats = pack(samples, SEQ, "truncate", 0)
    assert stats.rows == 2, stats
    x, y, p = model_inputs(tokens, flags)
    total = int((y != IGNORE).sum())
    dp_rank = mesh[DP].get_local_rank()
    loss = summed_loss(model, x[dp_rank : dp_rank + 1], y[dp_rank : dp_rank + 1], p[dp_rank : dp_rank + 1])
    (loss * dims.dp / total).backward()
    dist.all_reduce(loss, group=mesh[DP].get_group())

    ref_loss = torch.zeros(())
    for s in samples:
        one = np.where(s.targets, TARGET, 0).astype(np.uint8)
        one[0] |= START
        ref_loss = ref_loss + summed_loss(reference, *model_inputs(s.ids[None], one[None]))
    (ref_loss / total).backward()
    ref_grads = dict(reference.named_parameters())
    loss_diff = abs(loss.item() - ref_loss.item()) / total
    grad_diff = 0.0
    for name, param in model.named_parameters():
        g = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        grad_diff = max(grad_diff, (g - ref_grads[name].grad).abs().max().item())
    ok = loss_diff < 1e-6 and grad_diff < 1e-6
    if rank == 0:
        print(
            f"[packed_parallel] dp2 x tp2, {stats.rows} packed rows of {SEQ} vs {len(samples)} samples one by one: "
            f"|loss diff| {loss_diff:.2e}, max |grad diff| {grad_diff:.2e}: {'equal' if ok else 'MISMATCH'}",
            flush=True,
        )
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
