"""train.context_parallel's attention on CPU ranks over gloo against causal attention over the whole sequence.

    torchrun --standalone --nproc-per-node 2 cp_attention.py

For a load-balanced cut (seq_len 16: 4 chunks, rank r holding r and 3-r) and a plain one (seq_len 6: 2 chunks), with
grouped KV heads, in fp64: every rank's output for its slice and the gradients of its slice's queries, keys and values
(of a loss summed over all ranks' slices) against one SDPA call over the whole sequence with is_causal. Prints one
line on rank 0 with the largest difference; exits 1 on a mismatch.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from train.context_parallel import SequenceShards, gathered_attention

TOL = 1e-12


def largest_difference(shards: SequenceShards) -> float:
    g = torch.Generator().manual_seed(shards.seq_len)
    q, k, v = (torch.randn(2, h, shards.seq_len, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    weight = torch.randn(2, shards.seq_len, 4, 8, generator=g, dtype=torch.float64)  # the loss: sum(out * weight)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    (whole * weight).sum().backward()
    mine = shards.positions()
    local = [t.detach()[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
    attention = nn.Module()
    attention.sequence_shards = shards
    out, _ = gathered_attention(attention, *local, None, scaling=8**-0.5)
    (out * weight[:, mine]).sum().backward()
    diffs = [(out - whole[:, mine]).abs().max()]
    diffs += [(t.grad - full.grad[:, :, mine]).abs().max() for t, full in zip(local, (q, k, v), strict=True)]
    return max(d.item() for d in diffs)


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    found = {}
    for seq_len in (16, 6):
        shards = SequenceShards(seq_len, world, rank, dist.group.WORLD)
        diff = torch.tensor(largest_difference(shards), dtype=torch.float64)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        found[f"seq_len {seq_len} ({shards.num_chunks} chunks)"] = diff.item()
    ok = max(found.values()) < TOL
    if rank == 0:
        shown = ", ".join(f"{k}: {v:.1e}" for k, v in found.items())
        print(f"[cp_attention] largest |difference| {shown}: {'equal' if ok else 'DIFFERENT'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
