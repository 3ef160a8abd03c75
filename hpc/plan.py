"""Layout planner: dp x tp (x ep for a mixture of experts, x cp for long sequences) and activation checkpointing for a
Qwen3 shape on a site's GPUs.

    python -m hpc.plan --site ib-h200 --nodes 4 --model 8B [--seq-len 4096] [--micro-batch 1] [--master-dtype fp32]

Memory per GPU, for the trainer as it runs (train/parallel.py: tensor parallel inside
each decoder layer, FSDP2 over dp with bf16 compute and fp32 gradient reduction, AdamW):

* sharded state, 16 B/param: fp32 master weights 4 + fp32 grads 4 + AdamW m, v 8 (the
  trainer's master_dtype bf16: 8 B/param); decoder layers are split by tp and sharded by
  FSDP over dp, embeddings/lm_head over dp only;
* gathered: FSDP's unsharded layer (bf16 weights, current + prefetched, and bf16 grads with
  their fp32 copy for the reduce-scatter: 10 B/param of one layer / tp) and the root module
  (embeddings, lm_head, kept gathered: 8 B/param);
* activations, bf16 per token per layer: 4h replicated (norm inputs/outputs) plus
  ((3H + 3KV) d + 4I) / tp (q, k, v, normed q, k, attention output; gate, up, act, product);
  with activation checkpointing only each layer's input (2h B) plus one layer recomputed;
* activation offload (one GPU, train/offload.py): with checkpointing, the layers' inputs wait in host memory, so only
  one layer recomputed stays on the GPU;
* loss (train/loss.py, fused linear cross-entropy): one chunk of 4096 tokens' logits at
  4 B per token per vocab entry (bf16 logits and their bf16 gradient; the compiled chunk keeps its fp32 softmax in
  registers), the head's gradient (fp32 accumulator and bf16 copy: 6 B/param; none for a frozen head) and the hidden
  states' (bf16, 2 B per token x h);
* headroom: 10% of GPU memory for the CUDA context, NCCL buffers and fragmentation.

Mixture of experts (30B-A3B, 235B-A22B; train/moe.py): memory counts every parameter (total),
compute only those a token passes through (active: attention, router and top-k of the E
experts). Expert weights are split over ep ranks and sharded by FSDP over the rest of dp, so
their state is / dp like the rest (they are replicated over tp, not split), while FSDP gathers
only a layer's E/ep experts (10 B/param / ep). Per token and MoE layer the activations hold its
k routed copies: input and output (2h) and gate, up, activation and product (4 I_moe) in bf16,
plus the fp32 weighted outputs (4 B x k x h). Routing is taken as balanced.

All-to-all traffic per MoE layer and micro-batch: each token's k copies go out to the experts'
ranks and come back, forward and backward: 4 x tokens x k x h x 2 B, (ep-1)/ep of it leaving
the GPU. It rides NVLink while the EP group (ep x tp ranks) is inside a node.

Rule: the smallest tp (dividing the GPUs per node and the KV heads, so a TP group stays
on one node) that fits, activation checkpointing only when nothing fits without it, on one GPU activation offload
only when nothing fits without it either; for a
mixture of experts at each tp the largest ep inside a node (ep x tp <= GPUs per node, ep
dividing dp and the experts): the fewest expert weights to gather, and all-to-all on NVLink.

Context parallelism (train/context_parallel.py; dense shapes, rows not packed by document): cp ranks split every
sequence, so each holds seq_len / cp tokens' activations and loss; the state is sharded over dp x cp (as over dp
alone: it is / world either way). Attention all-gathers one layer's keys and values of the whole sequence (2 x
seq_len x KV heads / tp x head_dim in bf16), kept for backward in every layer without checkpointing (one layer with
it), plus their gradient in backward. Rule: cp only when no layout fits at cp = 1, the smallest (dividing the GPUs
outside tp, and seq_len by the trainer's rule) that fits.

LoRA (``--lora-r R``, train/adapters.py; dense shapes): the frozen base holds no gradients and no AdamW
state: 2 B/param in bf16 (``--quantize-base nf4``: 4 bits plus the double-quantized scales,
~0.52 B/param, on one GPU), sharded like the weights above; FSDP gathers its layers in bf16
without gradients (2 B/param of two layers / tp); the adapters (r x (in + out) per target
projection, all seven) carry the full 16 B/param (8 with bf16 master weights); the head gets
no gradient; activations as above; an NF4 base dequantizes one layer at a time (2 B/param of
a layer). The report also names the fewest GPUs that fit.

Model FLOPs per token (the trainer's MFU, train/metrics.py): 6 x (active non-embedding params +
lm_head params) + 12 x layers x heads x head_dim x seq_len.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hpc.node.bandwidth import bus_factor
from hpc.node.cli import HpcError, Parser, fail, path_text, whole
from hpc.site import Partition, SiteProfile, load_site
from train.front.batch_split import BatchSplit
from train.front.config import SHAPES, TrainConfig, cp_problem
from train.front.interface import LOSS_CHUNK_TOKENS
from train.front.layout import Layout, ep_degrees, tp_degrees
from train.front.tokenizer import check_tokenizer

HEADROOM = 0.10
STATE_B = {"fp32": 16, "bf16": 8}  # by master_dtype
LAYER_GATHER_B, ROOT_GATHER_B, LOGIT_B, HEAD_GRAD_B, ACT_B = 10, 8, 4, 6, 2
# frozen base bytes per parameter; NF4: 4 bits + an 8-bit scale per 64 weights + an fp32 factor per 256 scales
BASE_B = {"bf16": 2.0, "nf4": 0.5 + 1 / 64 + 4 / (64 * 256)}
LORA_GATHER_B = 4  # bf16 weights of the current and the prefetched layer, no gradients


class PlanError(HpcError):
    """No layout fits, or the request cannot be planned; the message is one line."""


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int = 0  # routed experts per layer (every layer a MoE layer); 0: dense
    top_k: int = 0
    moe_intermediate: int = 0

    @classmethod
    def from_dims(cls, name: str, d: dict, vocab: Optional[int] = None) -> "Shape":
        return cls(
            name,
            d["hidden_size"],
            d["num_hidden_layers"],
            d["num_attention_heads"],
            d.get("num_key_value_heads") or d["num_attention_heads"],
            d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
            d["intermediate_size"],
            vocab or d["vocab_size"],
            bool(d.get("tie_word_embeddings")),
            d.get("num_experts") or d.get("num_local_experts") or 0,
            d.get("num_experts_per_tok") or 0,
            d.get("moe_intermediate_size") or 0,
        )

    @property
    def dense_layer_params(self) -> int:
        """A layer's parameters outside its experts: attention, norms, and the MLP (dense) or the router (MoE)."""
        h, d = self.hidden, self.head_dim
        attn = h * self.heads * d * 2 + h * self.kv_heads * d * 2 + 2 * d
        return attn + (self.experts * h if self.experts else 3 * h * self.intermediate) + 2 * h

    @property
    def expert_layer_params(self) -> int:
        """A layer's expert weights (all E experts' SwiGLU MLPs)."""
        return self.experts * 3 * self.hidden * self.moe_intermediate

    @property
    def layer_params(self) -> int:
        return self.dense_layer_params + self.expert_layer_params

    @property
    def active_params(self) -> int:
        """The parameters one token passes through (embeddings included): top-k of the E experts."""
        return (
            self.layers * (self.dense_layer_params + self.top_k * 3 * self.hidden * self.moe_intermediate)
            + self.embed_params
        )

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embed_params

    def adapter_params_per_layer(self, r: int) -> int:
        """LoRA on the seven projections: r x (in + out) each."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return r * ((h + q) * 2 + (h + kv) * 2 + (h + i) * 3)

    def act_bytes_per_token_layer(self, tp: int) -> int:
        attn = (3 * self.heads + 3 * self.kv_heads) * self.head_dim
        if not self.experts:
            return ACT_B * (4 * self.hidden + (attn + 4 * self.intermediate) // tp)
        routed = self.top_k * (ACT_B * (2 * self.hidden + 4 * self.moe_intermediate) + 4 * self.hidden)
        return ACT_B * (4 * self.hidden + attn // tp) + routed + 4 * self.experts

    def flops_per_token(self, seq_len: int) -> int:
        """The trainer's model FLOPs per token (train.metrics.flops_per_token): on active parameters."""
        head = self.vocab * self.hidden
        return (
            6 * (self.active_params - self.embed_params + self.hidden + head)
            + 12 * self.layers * self.heads * self.head_dim * seq_len
        )


def qwen3_shape(name: str) -> Shape:
    """A released Qwen3 shape from the trainer's table (train.front.config.SHAPES)."""
    if name not in SHAPES or name.startswith("tiny"):
        raise PlanError(f"--model {name}: allowed: {', '.join(n for n in SHAPES if not n.startswith('tiny'))}")
    return Shape.from_dims(name, SHAPES[name].model_dump(exclude_none=True))


@dataclass(frozen=True)
class Candidate:
    tp: int
    dp: int
    ac: bool
    state_gb: float
    gathered_gb: float
    act_gb: float
    loss_gb: float
    budget_gb: float
    ep: int = 1
    offload: bool = False
    cp: int = 1

    @property
    def total_gb(self) -> float:
        return self.state_gb + self.gathered_gb + self.act_gb + self.loss_gb

    @property
    def fits(self) -> bool:
        return self.total_gb <= self.budget_gb

    @property
    def layout(self) -> Layout:
        return Layout(self.tp, self.ep, self.ac, self.offload, self.cp)

    @property
    def memory_option(self) -> str:
        """The activation setting as the report shows it."""
        return "offload" if self.offload else "on" if self.ac else "off"


@dataclass(frozen=True)
class Adapters:
    """LoRA of rank ``r`` on the seven projections over a frozen base in ``base`` (bf16 or nf4)."""

    r: int
    base: str = "bf16"


def memory(
    shape: Shape,
    tp: int,
    dp: int,
    ac: bool,
    tokens: int,
    gpu_gb: float,
    master_dtype: str = "fp32",
    lora: Optional[Adapters] = None,
    ep: int = 1,
    offload: bool = False,
    cp: int = 1,
) -> Candidate:
    """Per-GPU memory (GB) of one layout, by the model in the module docstring (``offload``: with ``ac``, one GPU;
    ``tokens``: per micro-batch, which ``cp`` ranks split)."""
    s, sequence, tokens = shape, tokens, tokens // cp
    dp *= cp  # FSDP shards over dp x cp
    if lora is None:
        state = STATE_B[master_dtype] * (
            s.layers * s.dense_layer_params / (tp * dp) + s.layers * s.expert_layer_params / dp + s.embed_params / dp
        )
        gathered = (
            LAYER_GATHER_B * (s.dense_layer_params / tp + s.expert_layer_params / ep) + ROOT_GATHER_B * s.embed_params
        )
    else:
        base = BASE_B[lora.base] * s.layers * s.layer_params / (tp * dp) + BASE_B["bf16"] * s.embed_params / dp
        state = base + STATE_B[master_dtype] * s.layers * s.adapter_params_per_layer(lora.r) / (tp * dp)
        gathered = (LORA_GATHER_B * s.layer_params / tp + BASE_B["bf16"] * s.embed_params) if tp * dp > 1 else 0.0
        if lora.base == "nf4":
            gathered += BASE_B["bf16"] * s.layer_params  # one layer dequantized
    per_layer = s.act_bytes_per_token_layer(tp)
    act = tokens * ((0 if offload else s.layers * ACT_B * s.hidden) + per_layer if ac else s.layers * per_layer)
    if cp > 1:  # the gathered keys and values of every layer kept for backward (one recomputed layer's), + gradient
        act += ACT_B * 2 * sequence * s.kv_heads // tp * s.head_dim * ((1 if ac else s.layers) + 1)
    head_grad = 0 if lora else HEAD_GRAD_B * s.vocab * s.hidden
    loss = min(tokens, LOSS_CHUNK_TOKENS) * s.vocab * LOGIT_B + head_grad + ACT_B * tokens * s.hidden
    return Candidate(
        tp, dp // cp, ac, state / 1e9, gathered / 1e9, act / 1e9, loss / 1e9, gpu_gb * (1 - HEADROOM), ep, offload, cp
    )


def tp_choices(shape: Shape, gpus_per_node: int) -> list[int]:
    return tp_degrees(shape.kv_heads, gpus_per_node)


def cp_choices(shape: Shape, world: int, tp: int, seq_len: int, packed: bool) -> list[int]:
    """Every cp > 1 the trainer allows here, smallest first: dividing the GPUs outside tp and seq_len; none for a
    mixture of experts."""
    if shape.experts:
        return []
    return [c for c in range(2, world // tp + 1) if (world // tp) % c == 0 and not cp_problem(c, seq_len, packed)]


def ep_choice(shape: Shape, tp: int, dp: int, gpus_per_node: int) -> int:
    """The largest allowed ep whose group (ep x tp ranks) stays inside a node; 1 for a dense model."""
    return max(e for e in ep_degrees(dp, shape.experts) if e * tp <= gpus_per_node)


@dataclass(frozen=True)
class Plan:
    shape: Shape
    nodes: int
    gpus_per_node: int
    gpu_gb: float
    tokens: int
    master_dtype: str
    candidates: tuple[Candidate, ...]
    chosen: Candidate
    seq_len: int
    lora: Optional[Adapters] = None
    fewest_gpus: Optional[int] = None  # the smallest job that fits (LoRA), in GPUs


def fewest_gpus(
    shape: Shape, gpus_per_node: int, gpu_gb: float, tokens: int, master_dtype: str, lora: Adapters, max_nodes: int = 64
) -> Optional[int]:
    """The fewest GPUs (1, 2, 4, ... within a node, then whole nodes) on which some layout fits; None if none up to
    max_nodes."""
    if lora.base == "nf4":
        return (
            1 if any(memory(shape, 1, 1, ac, tokens, gpu_gb, master_dtype, lora).fits for ac in (False, True)) else None
        )
    sizes = [g for g in (1, 2, 4, 8, 16) if g < gpus_per_node] + [n * gpus_per_node for n in range(1, max_nodes + 1)]
    for world in sizes:
        per_node = min(world, gpus_per_node)
        if any(
            memory(shape, t, world // t, ac, tokens, gpu_gb, master_dtype, lora).fits
            for t in tp_choices(shape, per_node)
            for ac in (False, True)
        ):
            return world
    return None


def plan(
    shape: Shape,
    nodes: int,
    gpus_per_node: int,
    gpu_gb: float,
    seq_len: int,
    micro_batch: int,
    master_dtype: str = "fp32",
    lora: Optional[Adapters] = None,
    packed: bool = False,
) -> Plan:
    """The smallest fitting tp, checkpointing only if needed, context parallelism only if nothing fits without it
    (``packed``: rows packed by document, which cp does not split); PlanError when nothing fits."""
    world, tokens = nodes * gpus_per_node, seq_len * micro_batch
    if lora is not None and shape.experts:
        raise PlanError(f"LoRA plans cover the dense Qwen3 shapes; Qwen3-{shape.name} is a mixture of experts")
    if lora is not None and lora.base == "nf4" and world > 1:
        raise PlanError(
            f"an NF4 base (lora.quantize_base=nf4) trains on one GPU: use --nodes 1 --gpus-per-node 1 (asked: {world} "
            "GPUs)"
        )
    cands = tuple(
        memory(
            shape,
            t,
            world // t,
            ac,
            tokens,
            gpu_gb,
            master_dtype,
            lora,
            ep=ep_choice(shape, t, world // t, gpus_per_node),
        )
        for t in tp_choices(shape, gpus_per_node)
        for ac in (False, True)
    )
    if world == 1:  # activation offload trains on one GPU: the last resort there
        cands += (memory(shape, 1, 1, True, tokens, gpu_gb, master_dtype, lora, offload=True),)
    if not any(c.fits for c in cands):  # the sequence split over GPUs
        split = [
            memory(shape, t, world // (t * cp), ac, tokens, gpu_gb, master_dtype, lora, cp=cp)
            for t in tp_choices(shape, gpus_per_node)
            for cp in cp_choices(shape, world, t, seq_len, packed)
            for ac in (False, True)
        ]
        cands += tuple(sorted(split, key=lambda c: c.cp))  # the smallest cp, then the smallest tp
    chosen = next((c for c in cands if c.fits), None)
    fewest = fewest_gpus(shape, gpus_per_node, gpu_gb, tokens, master_dtype, lora) if lora is not None else None
    if chosen is None and lora is not None:
        raise PlanError(
            f"Qwen3-{shape.name} LoRA r={lora.r} ({lora.base} base) does not fit {world} GPU(s) of {gpu_gb:g} GB at "
            f"seq_len {seq_len} x micro_batch {micro_batch}"
            + (f"; it fits from {fewest} GPU(s)" if fewest else "")
            + " (or use a shorter seq_len / smaller micro_batch)"
        )
    if chosen is None:
        best = min(cands, key=lambda c: c.total_gb)
        enough = next(
            (
                n
                for n in range(nodes + 1, 1025)
                if any(
                    memory(
                        shape,
                        t,
                        n * gpus_per_node // t,
                        True,
                        tokens,
                        gpu_gb,
                        master_dtype,
                        ep=ep_choice(shape, t, n * gpus_per_node // t, gpus_per_node),
                    ).fits
                    for t in tp_choices(shape, gpus_per_node)
                )
            ),
            None,
        )
        raise PlanError(
            f"Qwen3-{shape.name} does not fit {nodes} node(s) x {gpus_per_node} GPU(s) of {gpu_gb:g} GB at "
            f"seq_len {seq_len} x micro_batch {micro_batch} with {master_dtype} master weights: the best layout "
            f"(tp={best.tp}{f', cp={best.cp}' if best.cp > 1 else ''}, activation checkpointing "
            f"{'on' if best.ac else 'off'}) needs {best.total_gb:.1f} GB of {best.budget_gb:.1f} GB usable; "
            f"use more nodes (FSDP shards the state over them{f'; it fits from {enough}' if enough else ''})"
            f"{', master_dtype bf16 (half the state)' if master_dtype == 'fp32' else ''} or a shorter seq_len / "
            "smaller micro_batch"
        )
    return Plan(shape, nodes, gpus_per_node, gpu_gb, tokens, master_dtype, cands, chosen, seq_len, lora, fewest)


def tp_traffic_lines(p: Plan, intra_gbps: Optional[float], inter_gbps: Optional[float]) -> list[str]:
    """Why TP stays inside a node: its per-layer all-reduces at intra- vs inter-node bandwidth."""
    s = p.shape
    tp = p.chosen.tp if p.chosen.tp > 1 else min((t for t in tp_choices(s, p.gpus_per_node) if t > 1), default=2)
    msg = p.tokens * s.hidden * 2
    count = s.layers * (6 if p.chosen.ac else 4)
    lines = [
        f"TP traffic at tp={tp}: {count} all-reduces of {msg / 2**20:.0f} MiB per micro-batch "
        f"(2 per layer forward, 2 backward{', 2 recomputed' if p.chosen.ac else ''}), each on the critical path"
    ]
    if intra_gbps and inter_gbps:
        t_in = count * msg * bus_factor(tp) / (intra_gbps * 1e9)
        t_out = count * msg * bus_factor(tp) / (inter_gbps * 1e9)
        lines.append(
            f"  inside a node at {intra_gbps:g} GB/s: {t_in * 1e3:.0f} ms; across nodes at {inter_gbps:g} GB/s: "
            f"{t_out * 1e3:.0f} ms (x{intra_gbps / inter_gbps:.1f}), and it would compete with FSDP for the NICs"
        )
    else:
        lines.append("  the profile gives no network.expected bandwidths; TP stays inside a node by rule")
    lines.append(
        "FSDP traffic (all-gather of weights, reduce-scatter of grads) is per layer but overlaps compute: it crosses "
        "nodes"
    )
    return lines


def report(p: Plan, site: SiteProfile, part: Partition) -> str:
    s, c = p.shape, p.chosen
    exp = site.network.expected
    out = [
        f"plan for Qwen3-{s.name} on site {site.name}, partition {part.name}: {p.nodes} node(s) x {p.gpus_per_node} "
        "GPU(s) "
        f"of {p.gpu_gb:g} GB, {p.tokens} tokens per micro-batch per GPU",
        f"model: {s.params / 1e9:.2f} B params ({s.layers} layers x {s.layer_params / 1e6:.0f} M, embeddings "
        f"{s.embed_params / 1e9:.2f} B{', tied' if s.tied else ''}), {s.heads} heads / {s.kv_heads} KV heads, hidden "
        f"{s.hidden}",
        *moe_lines(p),
        (
            f"memory per GPU (GB): {STATE_B[p.master_dtype]} B/param {p.master_dtype} master+grad+AdamW sharded by "
            "FSDP over dp (layers also by tp), "
            f"bf16 compute, {HEADROOM:.0%} headroom"
        )
        if p.lora is None
        else (
            f"memory per GPU (GB): LoRA r={p.lora.r} on 7 projections "
            f"({s.layers * s.adapter_params_per_layer(p.lora.r) / 1e6:.1f} M adapter params, "
            f"{STATE_B[p.master_dtype]} B/param with grad+AdamW), frozen base {p.lora.base} at "
            f"{BASE_B[p.lora.base]:.2f} B/param without "
            f"gradients or AdamW state, bf16 compute, {HEADROOM:.0%} headroom"
        ),
        f"{'tp':>3} {'dp':>4} {'ep':>3} {'cp':>3} {'act.ckpt':>8} {'state':>7} {'gathered':>8} {'activ.':>7} "
        f"{'loss':>7} {'total':>7} {'usable':>7}  fits",
    ]
    for x in p.candidates:
        mark = "  <- chosen" if x == c else ""
        out.append(
            f"{x.tp:>3} {x.dp:>4} {x.ep:>3} {x.cp:>3} {x.memory_option:>8} {x.state_gb:7.1f} {x.gathered_gb:8.1f} "
            f"{x.act_gb:7.1f} "
            f"{x.loss_gb:7.1f} {x.total_gb:7.1f} {x.budget_gb:7.1f}  {'yes' if x.fits else 'no'}{mark}"
        )
    out.append(
        f"tp candidates divide {p.gpus_per_node} GPUs per node and {s.kv_heads} KV heads: "
        f"{', '.join(map(str, tp_choices(s, p.gpus_per_node)))}; rule: smallest tp that fits, "
        "activation checkpointing (one extra forward, ~1/3 more compute) only when needed, cp (the sequence split "
        "over GPUs) only when nothing fits without it"
    )
    out += tp_traffic_lines(p, exp.intra_node_gbps, exp.inter_node_gbps)
    out += ep_traffic_lines(p, exp.intra_node_gbps, exp.inter_node_gbps)
    if p.lora is not None:
        out.append(f"the fewest GPUs that fit this LoRA run: {p.fewest_gpus or 'none up to 64 nodes'}")
    out.append(
        f"proposal: dp={c.dp}{f' x cp={c.cp}' if c.cp > 1 else ''} x tp={c.tp}"
        f"{f' (ep={c.ep} inside dp)' if s.experts else ''}, activation checkpointing "
        f"{c.memory_option}  "
        f"->  {' '.join(c.layout.overrides())}"
    )
    return "\n".join(out)


def moe_lines(p: Plan) -> list[str]:
    """Total vs active parameters and the model FLOPs per token (MFU's numerator) of a mixture of experts."""
    s = p.shape
    if not s.experts:
        return []
    return [
        f"mixture of experts: {s.experts} experts, top-{s.top_k}, {s.expert_layer_params / 1e6:.0f} M expert params "
        "per layer; "
        f"total {s.params / 1e9:.2f} B (memory), active {s.active_params / 1e9:.2f} B per token (compute)",
        f"model FLOPs per token (MFU): 6 x (active non-embedding + lm_head) + 12 x layers x heads x head_dim x seq_len "
        f"= {s.flops_per_token(p.seq_len) / 1e9:.2f} GFLOP at seq_len {p.seq_len}",
    ]


def ep_traffic_lines(p: Plan, intra_gbps: Optional[float], inter_gbps: Optional[float]) -> list[str]:
    """The all-to-all volume per MoE layer and micro-batch, and its time inside a node vs across nodes."""
    s, c = p.shape, p.chosen
    if not s.experts:
        return []
    ep = c.ep if c.ep > 1 else ep_choice(s, 1, p.nodes * p.gpus_per_node, p.gpus_per_node)
    volume = 4 * p.tokens * s.top_k * s.hidden * 2 * (ep - 1) / ep
    lines = [
        f"EP traffic at ep={ep}: 4 all-to-alls per MoE layer and micro-batch (dispatch and combine, forward and "
        "backward), "
        f"{volume / 2**20:.0f} MiB leaving each GPU per layer, {s.layers * volume / 2**30:.1f} GiB per micro-batch"
    ]
    if intra_gbps and inter_gbps:
        lines.append(
            f"  inside a node at {intra_gbps:g} GB/s: {s.layers * volume / (intra_gbps * 1e9) * 1e3:.0f} ms per "
            "micro-batch; "
            f"across nodes at {inter_gbps:g} GB/s: {s.layers * volume / (inter_gbps * 1e9) * 1e3:.0f} ms; "
            f"the EP group (ep x tp = {ep * c.tp} GPUs) stays inside a node"
        )
    return lines


def plan_layout(
    cfg: TrainConfig, part: Partition, nodes: int, gpus_per_node: int
) -> tuple[Optional[Layout], Optional[str]]:
    """The planner's layout for a trainer config that chose none (neither its file nor an override sets a parallel.*
    key), on a partition that states its GPU memory; returns (layout, one-line note), or (None, None)."""
    if part.gpu_memory_gb is None or cfg.parallel.model_fields_set:
        return None, None
    dims = cfg.model.dims_dict()
    vocab = dims.get("vocab_size")
    if vocab is None:
        vocab = check_tokenizer(cfg.data.tokenizer)
        if vocab is None:
            raise PlanError(
                f"planning the layout: the tokenizer {cfg.data.tokenizer} has no tokenizer.json to count its "
                "vocabulary; "
                "set model.dims.vocab_size, or parallel.tp to choose the layout yourself"
            )
    shape = Shape.from_dims(cfg.model.shape or Path(cfg.model.path).name, dims, vocab)
    lora = Adapters(cfg.lora.r, "nf4" if cfg.lora.quantize_base == "nf4" else "bf16") if cfg.lora.enabled else None
    c = plan(
        shape,
        nodes,
        gpus_per_node,
        part.gpu_memory_gb,
        cfg.seq_len,
        cfg.micro_batch,
        cfg.master_dtype,
        lora,
        cfg.data.packed,
    ).chosen
    layout = Layout(
        c.tp, c.ep, c.ac and not cfg.activation_checkpointing, c.offload and not cfg.activation_offload, c.cp
    )
    note = (
        f"planner: dp={c.dp}{f' x cp={c.cp}' if c.cp > 1 else ''} x tp={c.tp}{f' (ep={c.ep})' if c.ep > 1 else ''}, "
        "activation checkpointing "
        f"{'on' if c.ac or cfg.activation_checkpointing else 'off'} "
        f"({c.total_gb:.3g} of {c.budget_gb:.3g} GB per GPU); adding {' '.join(layout.overrides())} "
        "(give parallel.tp= to choose yourself; python -m hpc.plan explains)"
    )
    return layout, note


def parser() -> Parser:
    ap = Parser(prog="python -m hpc.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--site", required=True, type=path_text, help="site profile name or YAML path")
    ap.add_argument("--nodes", type=whole(1, 100_000), required=True)
    ap.add_argument("--model", required=True, help="Qwen3 size: 0.6B, 1.7B, 4B, 8B, 14B, 32B, 30B-A3B, 235B-A22B")
    ap.add_argument("--partition", help="default: the profile's default partition")
    ap.add_argument("--gpus-per-node", type=whole(1, 100_000), help="default: all of the partition's")
    ap.add_argument("--seq-len", type=whole(1, 2**24), default=4096)
    ap.add_argument("--micro-batch", type=whole(1, 2**16), default=1)
    ap.add_argument(
        "--global-batch", type=whole(1, 2**24), help="rows per optimizer step: show how they split over the proposed dp"
    )
    ap.add_argument(
        "--master-dtype", choices=list(STATE_B), default="fp32", help="the trainer's master_dtype (default fp32)"
    )
    ap.add_argument("--lora-r", type=whole(1, 2**16), help="plan LoRA adapters of this rank on a frozen base (lora.r)")
    ap.add_argument(
        "--quantize-base",
        choices=["none", "nf4"],
        default="none",
        help="with --lora-r: nf4 = QLoRA (lora.quantize_base)",
    )
    return ap


def main(argv: Optional[Sequence[str]] = None) -> None:
    a = parser().parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `hpc.plan ... | head` ends quietly
    try:
        site = load_site(a.site)
        part = site.partition(a.partition)
        gpus = part.gpus_per_node if a.gpus_per_node is None else a.gpus_per_node
        if gpus > part.gpus_per_node:
            raise PlanError(f"--gpus-per-node {gpus}: partition {part.name} allows 1 to {part.gpus_per_node}")
        if a.nodes > part.max_nodes:
            raise PlanError(
                f"--nodes {a.nodes}: partition {part.name} of site {site.name} has at most {part.max_nodes} nodes"
            )
        if part.gpu_memory_gb is None:
            raise PlanError(
                f"site {site.name}: partition {part.name} has no gpu_memory_gb; add it to the profile to plan a layout"
            )
        if a.lora_r is not None and a.lora_r < 1 or a.quantize_base == "nf4" and a.lora_r is None:
            raise PlanError("--lora-r must be >= 1; --quantize-base nf4 needs --lora-r")
        lora = Adapters(a.lora_r, "nf4" if a.quantize_base == "nf4" else "bf16") if a.lora_r else None
        p = plan(
            qwen3_shape(a.model), a.nodes, gpus, part.gpu_memory_gb, a.seq_len, a.micro_batch, a.master_dtype, lora
        )
    except HpcError as e:
        fail("hpc.plan", e)
    print(report(p, site, part))
    if a.global_batch is not None:
        split = BatchSplit(a.global_batch, a.micro_batch, p.chosen.dp)
        print(f"batch: {split.describe()}" + (f"\nnote: {split.uneven_note()}" if split.uneven_note() else ""))


if __name__ == "__main__":
    main()
