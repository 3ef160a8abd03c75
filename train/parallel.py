"""Data x tensor (x expert) parallelism, applied in one explicit order (as torchtitan does).

1. ``ParallelDims`` (``train.front.layout``, torch-free) validates dp x cp x tp (and ep) against the world from the
   environment, before any process group exists, and names the mesh's dimensions.
2. ``build_mesh`` makes the device mesh: ("dp", "tp"), or with expert parallelism ("efsdp", "ep", "tp") whose first two
   flatten to "dp", or with context parallelism ("dp", "cp", "tp") whose first two flatten to "dp_cp"; tp is the
   inner, fastest-varying dimension, so a TP group is consecutive ranks, i.e. GPUs of one node. TP all-reduces
   activations in every layer, forward and backward, so it must ride on the fast intra-node links (NVLink); DP/FSDP
   traffic (all-gather of parameters, reduce-scatter of gradients) is per layer but overlaps compute and tolerates the
   slower inter-node network. "cp" sits between them (its key/value all-gathers per layer are next to TP on the
   critical path).
3. ``parallelize``: LoRA adapters (optional, ``train.adapters``), then float8 decoder linears (optional,
   ``train.float8``; with LoRA only the frozen bases), then tensor parallel per decoder layer, then expert parallel
   (``apply_ep``: a MoE model with ep on), then context parallel attention (``train.context_parallel``: cp on), then
   activation checkpointing, then torch.compile (optional), then FSDP2 over the "dp" mesh dimension ("dp_cp" with cp
   on: every cp rank computes gradients from its own tokens). A job of one rank gets no FSDP: with nothing to shard,
   its per-layer parameter and gradient copies only cost time (most of the 0.05 s of copy kernels in a 0.74 s
   Qwen3-1.7B step on one H200);
   ``train.precision.MasterWeights`` keeps the fp32 weights instead.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from hpc.node.contract import MASTER_ADDR_VAR
from hpc.node.launcher import local_cuda_index
from hpc.node.netcheck import bound_every_group, dist_timeout_s
from train import adapters, context_parallel, offload
from train.float8 import convert_decoder_linears, require_fp8
from train.front.config import LoraConfig
from train.front.layout import CP, DP, DP_CP, EFSDP, EP, TP, ParallelDims, WorldEnv
from train.moe import MoEBlock, moe_blocks
from train.tiled_mlp import tile_mlp


def init_distributed(env: WorldEnv) -> torch.device:
    """Start the process group (nccl on GPU, gloo on CPU) and return this rank's device."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_cuda_index(env.local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # bounded, every group: a dead, stopped or missing rank ends the job with an error instead of a hang
    timeout = bound_every_group(dist_timeout_s(os.environ))
    if MASTER_ADDR_VAR in os.environ:
        dist.init_process_group(
            backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def build_mesh(dims: ParallelDims, device: torch.device) -> DeviceMesh:
    """The device mesh of ``dims.mesh_dims()``; rank = dp_index * tp + tp_index, so TP groups are consecutive ranks on
    one node. With ep on, its (efsdp, ep) dimensions are flattened to dp as well: dp_index = efsdp_index x ep +
    ep_index; with cp on (never with ep), its (dp, cp) dimensions are flattened to dp_cp, which FSDP shards over."""
    shape, names = dims.mesh_dims()
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    flattened = dims.flattened()
    if flattened is not None:
        name, parts = flattened
        mesh[parts]._flatten(name)
        # a flattened dim sliced from the root (like TP) warns on every use that this will change
        warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh", category=UserWarning)
    return mesh


# Per decoder layer. The attention reshapes with -1 heads, so local head counts need no patching.
# q_norm/k_norm (RMSNorm over head_dim) see only the local heads: SequenceParallel on the heads
# dimension (2) makes their weights TP-replicated DTensors whose gradients are summed over TP.
LAYER_TP_PLAN = {
    "self_attn.q_proj": ColwiseParallel(),
    "self_attn.k_proj": ColwiseParallel(),
    "self_attn.v_proj": ColwiseParallel(),
    "self_attn.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    "self_attn.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    "self_attn.o_proj": RowwiseParallel(),
    "mlp.gate_proj": ColwiseParallel(),
    "mlp.up_proj": ColwiseParallel(),
    "mlp.down_proj": RowwiseParallel(),
}
# A MoE layer: tensor parallel attention; the MoE block sees the whole (TP-replicated) hidden states and its experts are
# replicated over TP (split over "ep" instead).
MOE_LAYER_TP_PLAN = {k: v for k, v in LAYER_TP_PLAN.items() if not k.startswith("mlp.")}


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks that FSDP shards over and that share each step's loss: dp, or dp x cp."""
    return mesh[DP_CP] if CP in (mesh.mesh_dim_names or ()) else mesh[DP]


def apply_ep(layers: nn.ModuleList, mesh: DeviceMesh) -> list[MoEBlock]:
    """Split every MoE block's experts over the "ep" mesh dimension (weights sharded on the expert dimension) and give
    the block its EP group for the token all-to-all; returns the blocks."""
    blocks = moe_blocks(layers)
    for block in blocks:
        block.ep_group = mesh[EP].get_group()
        for name, param in list(block.experts.named_parameters(recurse=False)):
            block.experts.register_parameter(name, nn.Parameter(distribute_tensor(param.data, mesh[EP], [Shard(0)])))
    return blocks


def parallelize(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    activation_checkpointing: bool | float,
    compile: bool,
    param_dtype: torch.dtype,
    fp8_recipe: str | None = None,
    lora: LoraConfig | None = None,
    adapter_dtype: torch.dtype = torch.float32,
    offload_to: torch.device | None = None,
    shards: context_parallel.SequenceShards | None = None,
    tiled_mlp: int = 0,
) -> nn.Module:
    """LoRA -> float8 -> TP -> EP -> CP -> activation checkpointing -> compile -> FSDP2, on a Qwen3ForCausalLM
    (typically on the meta device).

    ``shards`` (a mesh with "cp"): how the rows are cut over the cp ranks; every attention layer attends over its
    slice (``train.context_parallel``).

    ``lora`` (enabled): the model is frozen and the target projections get adapters in ``adapter_dtype``
    (``train.adapters.apply_lora``), which TP shards with their base layers.

    ``fp8_recipe`` (tensorwise or rowwise): the decoder layers' linears train in float8, with
    float8 all-gathers of their weights where FSDP shards over dp > 1 (tensorwise); a ConfigError
    where this rank cannot (see ``train.float8``).

    ``activation_checkpointing``: True (every layer), False, or the fraction of layers to
    checkpoint, spread evenly over the depth. Embeddings, final norm and lm_head stay
    replicated over TP: their inputs and output gradients are TP-replicated, so their
    gradients are exact on every TP rank. ``offload_to`` (one rank: ``train.offload``): the checkpointed layers keep
    their inputs in host memory, copied from and back to that device. On a mesh of one rank there is no FSDP (and no
    mixed-precision policy): the model computes in the dtype it is given. ``tiled_mlp`` (tokens, one rank's whole
    sequence: no TP): the dense MLPs run in checkpointed tiles (``train.tiled_mlp``).
    """
    layers = model.model.layers
    if lora is not None and lora.enabled:
        adapters.apply_lora(model, lora, adapter_dtype)
    if fp8_recipe is not None:
        require_fp8(mesh.device_type)
        convert_decoder_linears(
            layers,
            fp8_recipe,
            float8_all_gather=fp8_recipe == "tensorwise" and fsdp_mesh(mesh).size() > 1,
            only_frozen=lora is not None and lora.enabled,
        )
    if mesh[TP].size() > 1:
        for layer in layers:
            plan = MOE_LAYER_TP_PLAN if isinstance(layer.mlp, MoEBlock) else LAYER_TP_PLAN
            parallelize_module(layer, mesh[TP], adapters.tp_plan(plan, layer))
    ep_blocks = apply_ep(layers, mesh) if EP in (mesh.mesh_dim_names or ()) else []
    if lora is not None and lora.enabled:  # again: TP's SequenceParallel and EP's sharded experts made new parameters
        adapters.freeze_base(model)
    if shards is not None:
        context_parallel.apply(model, shards)
    checkpointed = checkpointed_layers(len(layers), float(activation_checkpointing))
    store = offload.HostStore(offload_to) if offload_to is not None else None
    for i, layer in enumerate(layers):
        if tiled_mlp and not isinstance(layer.mlp, MoEBlock):
            tile_mlp(layer.mlp, tiled_mlp)
        if store is not None:  # the layer compiled inside, the offloading wrapper outside the compiled code
            if compile:
                layer.compile()
            if i in checkpointed:
                layer = offload.offload_checkpoint(layer, store, i)
        else:
            if i in checkpointed:
                layer = checkpoint_wrapper(layer)
            if compile:
                layer.compile()
        layers[i] = layer
    if mesh.size() == 1:
        return model
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    shard_over = fsdp_mesh(mesh)
    reshard = shard_over.size() > 1  # one dp rank: keep the gathered (cast) parameters for backward
    for block in ep_blocks:
        # Expert weights: FSDP over the ranks outside their EP group. Their gradients hold the sum over the EP group's
        # tokens (the all-to-all's backward brings them home), so they are averaged over all of dp, not efsdp.
        fully_shard(block.experts, mesh=mesh[EFSDP], mp_policy=mp, reshard_after_forward=reshard)
        block.experts.set_gradient_divide_factor(mesh[DP].size())
        # gloo has no pre-multiplied sum: sum, then divide (not on one efsdp rank, where FSDP divides in its copy
        # already)
        block.experts.set_force_sum_reduction_for_comms(mesh.device_type == "cpu" and mesh[EFSDP].size() > 1)
    for layer in layers:
        fully_shard(layer, mesh=shard_over, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=shard_over, mp_policy=mp, reshard_after_forward=False)
    return model


def checkpointed_layers(num_layers: int, fraction: float) -> set[int]:
    """Indices of round(fraction x num_layers) layers spread evenly over the depth."""
    count = round(fraction * num_layers)
    return {int(k * num_layers / count) for k in range(count)} if count else set()


def clip_grad_norm_(params: list[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Global L2 norm of the gradients (clipped to max_norm if given) of FSDP2 parameters (DTensors on the dp or dp x tp
    mesh) or of plain parameters (replicated on every rank).

    Each rank sums the squares of its local shards, each divided by how many ranks hold a
    copy of that shard (the replication degree), then one all-reduce over the world gives
    the total. (Gradients are sharded or replicated here; FSDP has reduced any partial sums.)
    Returns the norm as a device tensor: nothing here waits for the device.
    """
    world = dist.get_world_size()
    grads = [p.grad for p in params if p.grad is not None]
    by_replicas: dict[int, list[torch.Tensor]] = {}
    for g in grads:
        if not isinstance(g, DTensor):
            by_replicas.setdefault(world, []).append(g)
            continue
        replicas = world // g.device_mesh.size()  # ranks outside the grad's mesh hold copies
        for dim, placement in enumerate(g.placements):
            if placement.is_replicate():
                replicas *= g.device_mesh.size(dim)
        by_replicas.setdefault(replicas, []).append(g.to_local())
    total = torch.zeros((), dtype=torch.float32, device=grads[0].device)
    for replicas, local in by_replicas.items():
        total += torch.stack(torch._foreach_norm(local)).float().pow(2).sum() / replicas
    dist.all_reduce(total)
    norm = total.sqrt()
    if max_norm is not None:
        norm64 = norm.double()  # the scale in float64, as a Python float would be
        scale = torch.where(norm64 > max_norm, max_norm / (norm64 + 1e-6), torch.ones_like(norm64))
        torch._foreach_mul_([g for local in by_replicas.values() for g in local], scale.float())
    return norm
