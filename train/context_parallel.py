"""Context parallelism: the ranks of a cp group each hold a slice of every sequence; attention gathers keys and values.

Sharding (``SequenceShards``): a row of seq_len tokens is cut into 2 x cp chunks and cp rank r holds chunks r and
2cp-1-r (load-balanced: under the causal mask every rank gets as much attention work), or, where seq_len is a
multiple of cp but not of 2 x cp, into cp chunks, rank r holding chunk r. input_ids and labels are cut alike: the data
stream shifted the labels on the whole row, so a slice's last label is the next slice's first token and the loss
counts every token of the row once. Each slice runs with its global positions as position ids, so RoPE rotates every
token as it would in the whole row.

Attention (``gathered_attention``, registered with transformers as ``ATTENTION``): every rank all-gathers the keys
and values of its layer over the cp group (after RoPE and before the GQA heads are repeated), puts the chunks in
sequence order, and each of its query chunks attends to the keys up to the chunk's end under a lower-right causal
mask (``torch.nn.attention.bias.causal_lower_right``: one SDPA call per chunk, no mask materialized where a fused
kernel takes it). The gather's backward sums each rank's gradient of the gathered keys and values back to their
owner (reduce-scatter on NCCL, all-reduce and slice on gloo), so the gradients equal one process's. Memory: one
layer's keys and values of the whole sequence at a time. This is the project's own implementation on every device:
PyTorch's ``torch.distributed.tensor.experimental.context_parallel`` (ring attention) targets CUDA SDPA kernels only
and is not used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

ATTENTION = "context_parallel_gather"


@dataclass(frozen=True)
class SequenceShards:
    """How rows of ``seq_len`` tokens are cut over the ``size`` ranks of a cp process group; this is cp rank
    ``rank``."""

    seq_len: int
    size: int
    rank: int
    group: dist.ProcessGroup | None = None

    @property
    def num_chunks(self) -> int:
        return 2 * self.size if self.seq_len % (2 * self.size) == 0 else self.size

    @property
    def chunk_len(self) -> int:
        return self.seq_len // self.num_chunks

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        """The chunks (in sequence order) cp rank ``rank`` holds."""
        return (rank, self.num_chunks - 1 - rank) if self.num_chunks == 2 * self.size else (rank,)

    def positions(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """This rank's global token positions, in the order its slice holds them."""
        c = self.chunk_len
        return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in self.chunks_of(self.rank)])

    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's slice of ``rows`` [batch, seq_len] (input ids or labels)."""
        return rows[:, self.positions(rows.device)]

    def sequence_order(self) -> list[int]:
        """The chunk slots of the gathered slices (rank by rank) in sequence order."""
        gathered = [i for r in range(self.size) for i in self.chunks_of(r)]
        return sorted(range(len(gathered)), key=gathered.__getitem__)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 2 ([batch, heads, tokens, head_dim]) over the group, rank by rank; backward: each rank's
    gradient of the whole sums back onto the slices' owners."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group = ctx.group
        parts = [p.contiguous() for p in grad.chunk(dist.get_world_size(group), dim=2)]
        if dist.get_backend(group) == dist.Backend.NCCL:
            out = torch.empty_like(parts[0])
            dist.reduce_scatter(out, parts, group=group)
            return out, None
        total = grad.contiguous()
        dist.all_reduce(total, group=group)  # gloo has no reduce-scatter
        return total.chunk(len(parts), dim=2)[dist.get_rank(group)].contiguous(), None


def _in_sequence_order(gathered: torch.Tensor, shards: SequenceShards) -> torch.Tensor:
    b, h, _, d = gathered.shape
    chunks = gathered.view(b, h, shards.num_chunks, shards.chunk_len, d)
    order = torch.tensor(shards.sequence_order(), device=gathered.device)
    return chunks.index_select(2, order).view(b, h, shards.seq_len, d)


def gathered_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface for a sequence slice: ``module.sequence_shards`` says which."""
    shards: SequenceShards = module.sequence_shards
    if attention_mask is not None:  # transformers builds none for an implementation it has no mask function for
        raise ValueError(f"{ATTENTION} attention builds its own causal mask; it got one")
    keys = _in_sequence_order(_GatherSequence.apply(key, shards.group), shards)
    values = _in_sequence_order(_GatherSequence.apply(value, shards.group), shards)
    c, gqa = shards.chunk_len, query.shape[1] != key.shape[1]
    outputs = []
    for slot, chunk in enumerate(shards.chunks_of(shards.rank)):
        end = (chunk + 1) * c
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, slot * c : (slot + 1) * c],
                keys[:, :, :end],
                values[:, :, :end],
                attn_mask=causal_lower_right(c, end),
                dropout_p=dropout,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, gathered_attention)


def apply(model: nn.Module, shards: SequenceShards) -> None:
    """Make every attention layer of a Qwen3 model attend over its sequence slice with ``gathered_attention``."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None:
            config._attn_implementation = ATTENTION
        if isinstance(module, Qwen3Attention):
            module.sequence_shards = shards
