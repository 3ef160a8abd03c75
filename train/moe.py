"""Qwen3-MoE with grouped experts: transformers' attention and layers, its sparse MoE block replaced by ``MoEBlock``.

``MoEBlock`` keeps the parameter names and shapes of transformers' Qwen3-MoE in memory
(``mlp.gate.weight`` (E, H); ``mlp.experts.gate_up_proj`` (E, 2I, H), gate rows first;
``mlp.experts.down_proj`` (E, H, I)), so a state dict moves between the two unchanged.

Routing follows transformers' numerics: router logits in the compute dtype, softmax in fp32,
``topk(sorted=True)``, the top-k probabilities renormalized when the config's ``norm_topk_prob``
is set. Every token reaches all of its top-k experts (dropless). The tokens are sorted by expert
(stably: token order within an expert), each expert multiplies its contiguous group (one
``torch._grouped_mm`` on CUDA; a loop of matmuls on CPU, the products transformers computes), and
each token's k outputs are weighted and summed in fp32 in the order of its top-k (no atomics:
the same sum every time), as torchtitan's Hugging Face MoE compatibility notes prescribe.

With expert parallelism (``ep`` > 1) each rank of an EP group holds E/ep experts: the sorted tokens
go to the ranks owning their experts by one all-to-all, come back by another, and the weighted
sum happens on the token's own rank. The expert weights are DTensors sharded on the expert
dimension over the "ep" mesh dimension (see ``train.parallel``).

The load-balancing loss is transformers' ``load_balancing_loss_func`` without padding: over the
L MoE layers and T tokens of a forward, with f_e the fraction of top-k assignments that went to
expert e and P_e the mean router probability of e, aux = E x sum_e f_e P_e (top-k assignments
counted k per token, as there). The trainer adds ``router_aux_loss_coef`` x aux to its objective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_to_all_single
from torch.distributed.tensor import DTensor
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.activations import ACT2FN
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from train.loss import linear_cross_entropy


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class Router(nn.Module):
    """Top-k softmax router (transformers' ``Qwen3MoeTopKRouter``: same ``weight`` and numerics)."""

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(fp32 probabilities (T, E), top-k weights (T, k) fp32, top-k expert indices (T, k))."""
        probs = F.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1, sorted=True)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights, experts


class GroupedExperts(nn.Module):
    """The experts' SwiGLU MLPs as 3-D weights; ``forward`` takes tokens grouped by (local) expert."""

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x`` (N, H): rows grouped by expert, ``counts[e]`` rows for local expert e (int64, sums to N)."""
        run = grouped_mlp if x.is_cuda else looped_mlp
        return run(x, _local(self.gate_up_proj), _local(self.down_proj), counts, self.act_fn)


def grouped_mlp(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor, act_fn
) -> torch.Tensor:
    """Every expert's SwiGLU over its group of rows in two ``torch._grouped_mm`` calls (no host sync)."""
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    gate, up = torch._grouped_mm(x, gate_up.to(x.dtype).transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
    return torch._grouped_mm(act_fn(gate) * up, down.to(x.dtype).transpose(-2, -1), offs=offsets)


def looped_mlp(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor, act_fn
) -> torch.Tensor:
    """The same, one expert at a time: the products transformers' eager experts compute, row for row."""
    out = []
    for e, rows in enumerate(torch.split(x, counts.tolist())):
        gate, up = F.linear(rows, gate_up[e]).chunk(2, dim=-1)
        out.append(F.linear(act_fn(gate) * up, down[e]))
    return torch.cat(out)


class MoEBlock(nn.Module):
    """Drop-in for transformers' ``Qwen3MoeSparseMoeBlock``: router, dropless dispatch, grouped experts, fp32 combine.

    After each forward, ``routing`` holds (assignments per expert (E,) float, fp32 router
    probabilities summed over the tokens (E,), tokens) for the load-balancing loss and load figures.
    """

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.gate = Router(config)
        self.experts = GroupedExperts(config)
        self.ep_group: dist.ProcessGroup | None = None  # set by train.parallel.apply_ep
        self.routing: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        probs, weights, experts = self.gate(x)
        flat = experts.flatten()  # (T k,), token-major
        counts = flat.new_zeros(self.num_experts).scatter_add_(
            0, flat, torch.ones_like(flat)
        )  # bincount would wait for the device
        self.routing = (counts.detach().float(), probs.sum(0), x.shape[0])
        order = torch.argsort(flat, stable=True)  # assignment slots grouped by expert, token order within each
        routed = x[order // self.top_k]
        if self.ep_group is None:
            y = self.experts(routed, counts)
        else:
            y = self._dispatch_compute_combine(routed, counts)
        slots = torch.empty_like(y).index_copy_(0, order, y)  # back to (token, k) order: a permutation, no sums
        out = (slots.view(-1, self.top_k, shape[-1]).float() * weights.unsqueeze(-1)).sum(dim=1)
        return out.to(hidden.dtype).reshape(shape)

    def _dispatch_compute_combine(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """All-to-all the expert-sorted rows to the ranks owning the experts, compute, and send the results back."""
        group = self.ep_group
        ep = dist.get_world_size(group)
        local_experts = self.num_experts // ep
        recv_counts = torch.empty_like(counts)  # (ep, local_experts): rows each source sends to each of my experts
        dist.all_to_all_single(recv_counts, counts, group=group)
        send_splits = counts.view(ep, local_experts).sum(1).tolist()
        recv_splits = recv_counts.view(ep, local_experts).sum(1).tolist()
        received = all_to_all_single(
            routed.new_empty(sum(recv_splits), routed.shape[-1]), routed, recv_splits, send_splits, group=group
        )
        # The rows arrive by source rank, each source's by expert: regroup by expert (stably, so by source within one).
        expert_of_row = torch.arange(local_experts, device=routed.device).repeat(ep).repeat_interleave(recv_counts)
        by_expert = torch.argsort(expert_of_row, stable=True)
        y = self.experts(received[by_expert], recv_counts.view(ep, local_experts).sum(0))
        y = torch.empty_like(y).index_copy_(0, by_expert, y)
        return all_to_all_single(routed.new_empty(routed.shape), y, send_splits, recv_splits, group=group)


def moe_blocks(model: nn.Module) -> list[MoEBlock]:
    """The model's MoE blocks, in layer order (the one place that finds them)."""
    return [m for m in model.modules() if isinstance(m, MoEBlock)]


def routing_summary(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """After a forward: (the load-balancing loss aux = E x sum_e f_e P_e over all MoE layers (with grad), tokens per
    expert of each MoE layer (L, E))."""
    blocks = moe_blocks(model)
    counts = torch.stack([b.routing[0] for b in blocks])
    prob_sums = torch.stack([b.routing[1] for b in blocks])
    rows = sum(b.routing[2] for b in blocks)
    aux = blocks[0].num_experts * torch.sum(counts.sum(0) / rows * (prob_sums.sum(0) / rows))
    return aux, counts


def load_imbalance(counts: torch.Tensor) -> torch.Tensor:
    """The worst MoE layer's max/mean tokens per expert (1.0 = perfectly balanced), from (L, E) counts."""
    return (counts.max(dim=1).values / counts.mean(dim=1).clamp(min=1e-9)).max()


class Qwen3MoeForTraining(Qwen3MoeForCausalLM):
    """``Qwen3MoeForCausalLM`` (same attention, norms and parameter names) with ``MoEBlock`` experts; its forward with
    ``labels`` returns only the next-token cross-entropy (``reduction`` mean or sum) through ``linear_cross_entropy``;
    the load-balancing loss is read after the forward with ``routing_summary``."""

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__(config)
        for layer in self.model.layers:
            if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock):
                layer.mlp = MoEBlock(config)

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        # transformers' experts_implementation (e.g. "grouped_mm", which it may have set on a shared config) selects
        # nothing here: MoEBlock runs its own grouped products. Accept it rather than refuse the config.
        return True

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        reduction: str = "mean",
        **kwargs,
    ):
        if labels is None:  # transformers' router-logit capture sees no Router of its own: off
            return super().forward(input_ids=input_ids, output_router_logits=False, **kwargs)
        hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        return linear_cross_entropy(hidden.flatten(0, 1), self.lm_head.weight, labels.flatten(), reduction=reduction)


def to_hf_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full state dict with fused expert weights -> the released Qwen3-MoE files' per-expert keys
    (``mlp.experts.{e}.gate_proj/up_proj/down_proj.weight``)."""
    out = {}
    for key, value in state.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            prefix = key.removesuffix("gate_up_proj")
            for e, (gate, up) in enumerate(zip(*value.chunk(2, dim=1), strict=False)):
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = gate, up
        elif key.endswith("mlp.experts.down_proj"):
            prefix = key.removesuffix("down_proj")
            for e, down in enumerate(value):
                out[f"{prefix}{e}.down_proj.weight"] = down
        else:
            out[key] = value
    return out
