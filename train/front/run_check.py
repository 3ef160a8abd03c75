"""The trainer's check of one run, torch-free: ``python -m train`` runs it first on every rank, and the login side
runs it for every job (each array task) before anything is submitted, so both refuse the same input with the same line.

Besides the config's own validation it holds every rule that needs the job's ranks or the model's structure: the
parallel layout, the features' layouts (QLoRA's and activation offload's single rank, the straggler test ranks), the
model's type, vocabulary and experts, the LoRA targets each decoder layer has (``decoder_linears``: transformers'
Qwen3 and Qwen3-MoE layers, from the config's fields) and the NF4 block rule. ``train.adapters`` and ``train.model``
refuse with the same functions' lines."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from hpc.node.cli import shown
from train.front.config import ConfigError, TrainConfig
from train.front.layout import ParallelDims, WorldEnv

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
NF4_BLOCK = 64  # NF4 quantizes blocks of this many weights
# transformers' defaults for the fields a config.json may leave out (Qwen3Config, Qwen3MoeConfig; a unit test compares)
LIBRARY_DEFAULTS = {
    "qwen3": {
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "vocab_size": 151936,
    },
    "qwen3_moe": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 151936,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}
_WHOLE = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "decoder_sparse_step",
    "num_key_value_heads",
    "head_dim",
)
_DERIVED = ("num_key_value_heads", "head_dim")  # null: derived from the others, as transformers does


def check_run(cfg: TrainConfig, env: WorldEnv) -> ParallelDims:
    """The files the run reads and writes, its parallel layout for ``env``'s ranks, the model's structure and the
    features' rules; raises an HpcError (one line)."""
    tokens = cfg.check_paths()
    model = model_dims(cfg)
    dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads(), num_experts=cfg.model.num_experts())
    problem = (
        weights_problem(cfg.model.path)
        or vocab_problem(model["vocab_size"], tokens)
        or lora_problem(cfg, model, env.world_size)
        or offload_problem(cfg, env.world_size)
        or straggler_problem(cfg, env.world_size)
        or snapshot_problem(cfg.checkpoint.memory_every, env.world_size, env.local_world_size)
    )
    if problem:
        raise ConfigError(problem)
    return dims


def ignored_settings(cfg: TrainConfig) -> list[str]:
    """Settings that have no effect because their feature was switched off on purpose (``lora.enabled: false`` with
    other lora keys, say a config made for LoRA run as a full fine-tune): one line each, warned, not refused (left at
    its default, the switch makes them a refusal: ``train.front.config``)."""
    lines = []
    for section, name in ((cfg.lora, "lora"), (cfg.fp8, "fp8")):
        unused = sorted(section.model_fields_set - {"enabled"})
        if unused and not section.enabled:
            lines.append(
                f"{', '.join(f'{name}.{k}' for k in unused)} ha{'ve' if len(unused) > 1 else 's'} no effect: "
                f"{name}.enabled=false"
            )
    return lines


def model_dims(cfg: TrainConfig) -> dict:
    """The config fields of the model the ranks build: model_type, the shape's dims (vocab_size None: the tokenizer's,
    rounded up to 64) or model.path's config.json over transformers' defaults; a field that is not a whole number is
    a ConfigError naming it."""
    dims = cfg.model.dims_dict()
    if cfg.model.path is None:
        return {"model_type": "qwen3_moe" if dims.get("num_experts") else "qwen3", "vocab_size": None, **dims}
    model_type = dims.get("model_type")
    if "num_local_experts" in dims:  # transformers 5 writes num_experts under this name
        dims = {"num_experts": dims["num_local_experts"], **dims}
    full = {**LIBRARY_DEFAULTS.get(model_type, LIBRARY_DEFAULTS["qwen3"]), **dims}
    for key, value in ((k, full[k]) for k in _WHOLE if k in full and not (full[k] is None and k in _DERIVED)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"model.path: {cfg.model.path}/config.json: {key}={shown(value)} is not a whole number of at least 1"
            )
    layers = full["mlp_only_layers"] = full.get("mlp_only_layers") or []  # null: none, as transformers reads it
    if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise ConfigError(
            f"model.path: {cfg.model.path}/config.json: mlp_only_layers={shown(layers)} is not a list of layer numbers"
        )
    return full


def is_sparse_layer(dims: dict, layer: int) -> bool:
    """Whether decoder layer ``layer`` holds a mixture-of-experts block instead of a dense MLP (transformers' rule)."""
    if dims.get("model_type") != "qwen3_moe" or not dims.get("num_experts"):
        return False
    return layer not in dims.get("mlp_only_layers", []) and (layer + 1) % dims.get("decoder_sparse_step", 1) == 0


def decoder_linears(dims: dict, layer: int) -> dict[str, tuple[int, int]]:
    """The nn.Linear modules of decoder layer ``layer`` (``model_dims``' fields), by name: (out, in) features, as
    transformers builds them; a mixture-of-experts block's router and experts are not linear layers."""
    hidden, heads = dims["hidden_size"], dims["num_attention_heads"]
    kv = dims.get("num_key_value_heads") or heads
    head_dim = dims.get("head_dim") or hidden // heads
    shapes = {
        "q_proj": (heads * head_dim, hidden),
        "k_proj": (kv * head_dim, hidden),
        "v_proj": (kv * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
    }
    if not is_sparse_layer(dims, layer):
        inter = dims["intermediate_size"]
        shapes |= {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    return shapes


def module_path(name: str) -> str:
    """A decoder layer's linear by its path in the layer: self_attn.q_proj, mlp.gate_proj."""
    return f"{'self_attn' if name in ATTENTION else 'mlp'}.{name}"


def missing_target(target: str, layer: int, linears) -> str:
    return (
        f"lora.target_modules: {target} is not a linear layer of decoder layer {layer} (it has: "
        f"{', '.join(sorted(linears)) or 'none'})"
    )


def nf4_block_problem(name: str, shape: tuple[int, int]) -> str | None:
    """Why a projection of this (out, in) shape cannot be stored in NF4, or None."""
    if math.prod(shape) % NF4_BLOCK:
        return (
            f"lora.quantize_base=nf4: {name} holds {shape[0]} x {shape[1]} weights, not a multiple of {NF4_BLOCK} "
            "(NF4 quantizes blocks of 64): use lora.quantize_base=none or other model dims"
        )
    return None


def lora_problem(cfg: TrainConfig, dims: dict, world_size: int) -> str | None:
    """The adapters' rules: QLoRA's single rank, every target in every decoder layer, the NF4 block rule, torchao."""
    lora = cfg.lora
    if not lora.enabled:
        return None
    nf4 = lora.quantize_base == "nf4"
    if nf4 and world_size > 1:  # the NF4 base is not sharded
        return (
            f"lora.quantize_base=nf4 trains on one rank (one GPU); this job has WORLD_SIZE={world_size}: "
            "use lora.quantize_base=none (a bf16 base sharded by FSDP x TP) or one rank"
        )
    for layer in range(dims["num_hidden_layers"]):
        linears = decoder_linears(dims, layer)
        missing = [t for t in lora.target_modules if t not in linears]
        if missing:
            return missing_target(missing[0], layer, linears)
        for target in lora.target_modules if nf4 else ():
            problem = nf4_block_problem(f"model.layers.{layer}.{module_path(target)}", linears[target])
            if problem:
                return problem
    if nf4 and importlib.util.find_spec("torchao") is None:
        return "lora.quantize_base=nf4 needs torchao: pip install 'hpc-train[fp8]'"
    return None


def weights_problem(path: str | None) -> str | None:
    """A model.path directory holds its weights as safetensors."""
    if path is not None and not any(Path(path).glob("*.safetensors")):
        return f"model.path: {path} has no *.safetensors files"
    return None


def vocab_problem(vocab_size: int | None, tokens: int | None) -> str | None:
    """The model's vocabulary must hold the tokenizer's tokens (None: not known, or taken from the tokenizer)."""
    if vocab_size is not None and tokens is not None and tokens > vocab_size:
        return (
            f"model: vocab_size={vocab_size} is smaller than the tokenizer's {tokens} tokens; use a matching "
            "data.tokenizer"
        )
    return None


def offload_problem(cfg: TrainConfig, world_size: int) -> str | None:
    """Activation offload (train/offload.py) trains on one rank: its layers' inner backward runs without FSDP."""
    if cfg.activation_offload and world_size > 1:
        return (
            f"activation_offload=true trains on one rank (one GPU); this job has WORLD_SIZE={world_size}: "
            "use activation_checkpointing alone"
        )
    return None


def snapshot_problem(every: int, world_size: int, local_world_size: int) -> str | None:
    """checkpoint.memory_every needs a next node for each node's partner copy, with as many ranks as its own."""
    if not every:
        return None
    if world_size == local_world_size:
        return (
            f"checkpoint.memory_every={every}: needs ranks on 2 or more nodes (each node's copy goes to the next "
            f"node); all {world_size} rank(s) run on one node: set checkpoint.memory_every=0"
        )
    if world_size % local_world_size:
        return (
            f"checkpoint.memory_every={every}: needs the same number of ranks on every node ({world_size} ranks, "
            f"{local_world_size} per node): set checkpoint.memory_every=0"
        )
    return None


def straggler_problem(cfg: TrainConfig, world_size: int) -> str | None:
    """The test-only slow and stopped ranks must be ranks of this run."""
    for key in ("test_slow_rank", "test_stop_rank"):
        rank = getattr(cfg.straggler, key)
        if rank is not None and rank >= world_size:
            return f"straggler.{key}={rank}: the run has ranks 0 to {world_size - 1}"
    return None
