"""Qwen3 model: config from a named shape or a local HF directory, meta-device build, initial weights, HF export.

The model is built on the meta device and parallelized before any memory is allocated, then filled tensor by
tensor, so no rank ever holds the whole model. A random init draws each tensor from a generator seeded with the run's
seed and the tensor's name (Hugging Face's init: norms 1, other weights N(0, initializer_range)), on the device, and
each rank keeps only its shard: the same initial weights for every dp x tp x ep layout on one kind of device. A local
HF directory's (sharded) safetensors are read by every rank itself, only the slices its shards hold
(``torch.distributed.checkpoint``'s Hugging Face reader). A QLoRA base (one rank) is quantized to NF4 projection by
projection as each arrives, so the peak is the NF4 base plus one tensor in bf16.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import (
    AutoConfig,
    GenerationConfig,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
)

from train.adapters import LoraLinear, hf_key, init_adapters, is_adapter_key, nf4_weight
from train.front.config import ConfigError, ModelConfig, model_type_problem
from train.front.run_check import vocab_problem, weights_problem
from train.loss import linear_cross_entropy
from train.moe import Qwen3MoeForTraining, to_hf_experts
from train.shards import fill

_EXPORT_SHARD_SIZE = "5GB"


def is_moe(config: Qwen3Config | Qwen3MoeConfig) -> bool:
    return isinstance(config, Qwen3MoeConfig)


def hf_config(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config | Qwen3MoeConfig:
    """The config to train (Qwen3Config, or Qwen3MoeConfig for a mixture of experts): the directory's config.json, or
    the shape's dims with the tokenizer's vocab and special tokens."""
    if cfg.path is not None:
        config = AutoConfig.from_pretrained(cfg.path)
        if type(config) not in (Qwen3Config, Qwen3MoeConfig):  # the config's validation refuses it first
            raise ConfigError(model_type_problem(cfg.path, config.model_type))
    else:
        dims = cfg.dims_dict()
        rope_theta = dims.pop("rope_theta")
        dims.setdefault("vocab_size", -(-len(tokenizer) // 64) * 64)
        rope = {"rope_type": "default", "rope_theta": rope_theta}
        # A MoE shape has num_experts; no sliding window (Qwen3MoeConfig's class default is 4096, the models' null).
        config = (
            Qwen3MoeConfig(**dims, rope_parameters=rope, sliding_window=None)
            if "num_experts" in dims
            else Qwen3Config(**dims, rope_parameters=rope)
        )
        config.eos_token_id = tokenizer.eos_token_id
        config.bos_token_id = tokenizer.bos_token_id
    # No padding_idx: nn.Embedding would freeze that row, while packed blocks hold no padding
    # and a tokenizer's pad is often its EOS, the document separator.
    config.pad_token_id = None
    problem = vocab_problem(
        config.vocab_size, len(tokenizer)
    )  # train.front.run_check refuses it first, from the tokenizer's files
    if problem:
        raise ConfigError(problem)
    config.use_cache = False
    config._attn_implementation = cfg.attn_implementation
    return config


class Qwen3ForTraining(Qwen3ForCausalLM):
    """``Qwen3ForCausalLM`` (same modules and weights) whose forward with ``labels`` returns only the
    next-token cross-entropy over the counted labels (not -100; ``reduction`` mean or sum), through
    ``linear_cross_entropy``: the logits are never materialized."""

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        reduction: str = "mean",
        **kwargs,
    ):
        if labels is None:
            return super().forward(input_ids=input_ids, **kwargs)
        hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        return linear_cross_entropy(hidden.flatten(0, 1), self.lm_head.weight, labels.flatten(), reduction=reduction)


def build_meta_model(config: Qwen3Config | Qwen3MoeConfig) -> Qwen3ForTraining | Qwen3MoeForTraining:
    """The model skeleton on the meta device (no memory), ready to be parallelized."""
    with torch.device("meta"):
        return Qwen3MoeForTraining(config) if is_moe(config) else Qwen3ForTraining(config)


def count_params(config: Qwen3Config | Qwen3MoeConfig) -> dict[str, int]:
    """Parameter counts: total (tied weights once), embedding, lm_head (its matmul, tied or not), non_embedding (decoder
    layers + final norm), and active_non_embedding: those a token passes through (a MoE counts top-k of its experts)."""
    model = build_meta_model(config)
    non_embedding = sum(p.numel() for p in model.model.layers.parameters()) + sum(
        p.numel() for p in model.model.norm.parameters()
    )
    experts = sum(p.numel() for name, p in model.model.layers.named_parameters() if ".mlp.experts." in name)
    idle = experts - experts * config.num_experts_per_tok // config.num_experts if is_moe(config) else 0
    return {
        "total": sum(p.numel() for p in model.parameters()),
        "embedding": model.model.embed_tokens.weight.numel(),
        "lm_head": model.lm_head.weight.numel(),
        "non_embedding": non_embedding,
        "active_non_embedding": non_embedding - idle,
    }


def _tensor_seed(seed: int, name: str) -> int:
    """The generator seed of one tensor: the run's seed and the tensor's Hugging Face name."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def initial_value(name: str, shape: tuple[int, ...], std: float, seed: int, device: torch.device) -> torch.Tensor:
    """The full fp32 initial value of the tensor ``name`` (a Hugging Face name) as Hugging Face initializes Qwen3 and
    Qwen3-MoE: RMSNorm weights 1, biases 0, every other weight (projections, embeddings, router, experts) N(0, std),
    drawn on ``device`` from its own seeded generator."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device)
    if name.endswith(".bias"):
        return torch.zeros(shape, device=device)
    generator = torch.Generator(device).manual_seed(_tensor_seed(seed, name))
    return torch.empty(shape, device=device).normal_(0.0, std, generator=generator)


@torch.no_grad()
def _random_init(model: nn.Module, config: Qwen3Config | Qwen3MoeConfig, seed: int, device: torch.device) -> None:
    """Fill a materialized model's weights with the seeded init, tensor by tensor: each rank draws one full tensor at a
    time and keeps its shard (no collective)."""
    for key, value in get_model_state_dict(model).items():
        hf = hf_key(key)
        if is_adapter_key(key) or (config.tie_word_embeddings and hf == "lm_head.weight"):
            continue
        fill(value, initial_value(hf, tuple(value.shape), config.initializer_range, seed, device))


def _check_hf_tensors(path: str, want: dict[str, tuple[int, ...]]) -> None:
    """Compare the directory's safetensors headers with the tensors its config.json asks for (names, shapes)."""
    have: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        try:
            with safe_open(file, framework="pt") as f:
                have |= {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as e:  # safetensors' own error types
            raise ConfigError(
                f"model.path: {file} is not a readable safetensors file ({' '.join(str(e).split())[:200]})"
            ) from None
    missing = [k for k in want if k not in have]
    shapes = [
        f"{k} is {list(have[k])}, config.json needs {list(s)}" for k, s in want.items() if k in have and have[k] != s
    ]
    if missing or shapes:
        parts = (
            [f"{len(missing)} tensor(s) missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"]
            if missing
            else []
        )
        parts += shapes[:3] + ([f"{len(shapes) - 3} more of another shape"] if len(shapes) > 3 else [])
        raise ConfigError(f"model.path: {path}: its safetensors do not fit its config.json: {'; '.join(parts)}")


def _load_hf_shards(model: nn.Module, path: str, config: Qwen3Config | Qwen3MoeConfig) -> None:
    """Fill the (parallelized, materialized) model from the directory's safetensors; each rank reads only its slices
    (of fused expert weights: the experts its shard holds, from the files' per-expert tensors). Collective."""
    problem = weights_problem(path)  # train.front.run_check refuses it first
    if problem:
        raise ConfigError(problem)
    names = _hf_names(model)
    full = get_model_state_dict(model)
    state = {hf: full[key] for hf, key in names.items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # not in the files: the head is the embedding
    fused = {
        k: state.pop(k) for k in list(state) if k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))
    }
    pieces = {k: _expert_pieces(k, v) for k, v in fused.items()}
    wanted = state | {name: t for p in pieces.values() for name, t in p.items()}
    _check_hf_tensors(path, {k: tuple(v.shape) for k, v in wanted.items()})
    try:
        dcp.load(wanted, storage_reader=HuggingFaceStorageReader(path))
    except (Exception, CheckpointException) as e:  # DCP gathers every rank's read errors into one CheckpointException
        raise ConfigError(
            f"model.path: {path}: its safetensors do not load ({' '.join(str(e).split())[:200]})"
        ) from None
    for key, value in fused.items():
        _fill_experts(key, value, pieces[key])
    state |= fused
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    set_model_state_dict(
        model, {names[hf]: v for hf, v in state.items()}, options=StateDictOptions(strict=len(names) == len(full))
    )


def _hf_names(model: nn.Module) -> dict[str, str]:
    """Hugging Face name -> model key of every weight but LoRA adapters (a wrapped projection's base_layer is the
    projection)."""
    return {hf_key(k): k for k in get_model_state_dict(model) if not is_adapter_key(k)}


def _expert_range(value: torch.Tensor) -> tuple[int, int]:
    """The experts (dim 0 rows) this rank's shard of a fused expert weight holds: (first, count)."""
    if not isinstance(value, DTensor):
        return 0, value.shape[0]
    shape, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
    return offset[0], shape[0]


def _expert_file_names(key: str) -> tuple[str, ...]:
    """The per-expert weights of the files that make one row of a fused expert weight (gate rows first, then up)."""
    return ("gate_proj", "up_proj") if key.endswith("gate_up_proj") else ("down_proj",)


def _expert_pieces(key: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """The files' per-expert tensors (empty, to be read) for the experts this rank's shard of ``key`` holds."""
    prefix, (first, count), names = key.rsplit(".", 1)[0], _expert_range(value), _expert_file_names(key)
    shape = (value.shape[1] // len(names), value.shape[2])
    return {
        f"{prefix}.{e}.{n}.weight": torch.empty(shape, dtype=value.dtype)
        for e in range(first, first + count)
        for n in names
    }


def _fill_experts(key: str, value: torch.Tensor, pieces: dict[str, torch.Tensor]) -> None:
    """Copy the per-expert tensors read into this rank's shard of the fused weight."""
    local = value.to_local() if isinstance(value, DTensor) else value
    prefix, (first, count), names = key.rsplit(".", 1)[0], _expert_range(value), _expert_file_names(key)
    with torch.no_grad():
        for row, e in enumerate(range(first, first + count)):
            local[row].copy_(torch.cat([pieces[f"{prefix}.{e}.{n}.weight"] for n in names]))


def materialize(model: nn.Module, config: Qwen3Config | Qwen3MoeConfig, device: torch.device) -> None:
    """Allocate a meta-device model's parameters on ``device`` (uninitialized) and recompute the rotary table (fp32)."""
    model.to_empty(device=device)
    model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)  # non-persistent buffers: recompute


def load_initial_weights(
    model: nn.Module,
    cfg: ModelConfig,
    config: Qwen3Config | Qwen3MoeConfig,
    seed: int,
    device: torch.device,
    nf4: bool = False,
) -> None:
    """Allocate the (parallelized, meta) model on ``device`` and fill it, tensor by tensor: from model.path's
    safetensors, each rank its slices, or from the seeded random init; LoRA adapters (if any) from
    ``train.adapters.init_adapters``. ``nf4`` (QLoRA, one rank): each LoRA base projection is quantized as it
    arrives."""
    adapters = any(isinstance(m, LoraLinear) for m in model.modules())
    if nf4:
        _stream_one_rank(model, cfg, config, seed, device)
    else:
        materialize(model, config, device)
        if cfg.path is not None:
            _load_hf_shards(model, cfg.path, config)
        else:
            _random_init(model, config, seed, device)
    if adapters:
        init_adapters(model, seed)


def _canonical(name: str) -> str:
    """A module or parameter name without the wrappers' parts (activation checkpointing, compile)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def _hf_file_tensors(path: str) -> dict[str, Path]:
    """Every tensor name of the directory's safetensors -> its file."""
    where = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            where |= dict.fromkeys(f.keys(), file)
    return where


def _read_hf_tensor(where: dict[str, Path], name: str, device: torch.device) -> torch.Tensor:
    """One weight from the files onto ``device``; a fused expert weight from its per-expert tensors."""
    if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
        prefix, names = name.rsplit(".", 1)[0], _expert_file_names(name)
        rows, e = [], 0
        while f"{prefix}.{e}.{names[0]}.weight" in where:
            rows.append(torch.cat([_read_hf_tensor(where, f"{prefix}.{e}.{n}.weight", device) for n in names]))
            e += 1
        return torch.stack(rows)
    with safe_open(where[name], framework="pt", device=str(device)) as f:
        return f.get_tensor(name)


def _one_rank_params(model: nn.Module) -> Iterator[tuple[nn.Module, str, str]]:
    """(module, parameter attribute, canonical model key) of every parameter, shared ones once."""
    seen = set()
    for module_name, module in model.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                yield module, attr, _canonical(f"{module_name}.{attr}" if module_name else attr)


@torch.no_grad()
def _stream_one_rank(
    model: nn.Module, cfg: ModelConfig, config: Qwen3Config | Qwen3MoeConfig, seed: int, device: torch.device
) -> None:
    """Materialize a one-rank meta model parameter by parameter from the seeded init or model.path, each LoRA base
    projection quantized to NF4 as it arrives (``train.adapters.nf4_weight``): no more than one tensor in full at a
    time."""
    where = None
    if cfg.path is not None:
        problem = weights_problem(cfg.path)  # train.front.run_check refuses it first
        if problem:
            raise ConfigError(problem)
        want = {
            hf_key(k): tuple(getattr(m, attr).shape) for m, attr, k in _one_rank_params(model) if not is_adapter_key(k)
        }
        if config.tie_word_embeddings:
            want.pop("lm_head.weight", None)
        fused = [k for k in want if k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))]
        for k in fused:
            shape = want.pop(k)
            names = _expert_file_names(k)
            want |= {
                f"{k.rsplit('.', 1)[0]}.{e}.{n}.weight": (shape[1] // len(names), shape[2])
                for e in range(shape[0])
                for n in names
            }
        _check_hf_tensors(cfg.path, want)
        where = _hf_file_tensors(cfg.path)
    tied = config.tie_word_embeddings
    for module, attr, key in list(_one_rank_params(model)):
        param = getattr(module, attr)
        hf = hf_key(key)
        if is_adapter_key(key):
            value = torch.empty(param.shape, dtype=param.dtype, device=device)  # init_adapters fills them
        elif tied and hf == "lm_head.weight":
            continue
        elif where is not None:
            value = _read_hf_tensor(where, hf, device)
        else:
            value = initial_value(hf, tuple(param.shape), config.initializer_range, seed, device)
        if attr == "weight" and key.endswith(".base_layer.weight"):
            new = nn.Parameter(nf4_weight(value.to(param.dtype), hf), requires_grad=False)
        else:
            new = nn.Parameter(value.to(param.dtype), requires_grad=param.requires_grad)
        setattr(module, attr, new)
        del value
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)


def export_hf(
    model: nn.Module,
    config: Qwen3Config | Qwen3MoeConfig,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    to_hf: Callable[[dict], dict] | None = None,
) -> None:
    """Gather the full weights to rank 0 and write a directory AutoModelForCausalLM.from_pretrained loads. Collective.
    ``to_hf`` turns the gathered state into Hugging Face weights (LoRA: ``train.adapters.merged_state``)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    # Gathering dp x tp sharded weights warns once per tensor that it takes two all-gathers; expected here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return
    if to_hf is not None:
        state = to_hf(state)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {k: v.contiguous() for k, v in to_hf_experts(state).items()}
    split = split_torch_state_dict_into_shards(
        state, filename_pattern="model{suffix}.safetensors", max_shard_size=_EXPORT_SHARD_SIZE
    )
    for filename, keys in split.filename_to_tensors.items():
        save_file({k: state[k] for k in keys}, out / filename, metadata={"format": "pt"})
    if split.is_sharded:
        index = {
            "metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
            "weight_map": split.tensor_to_filename,
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    export_config = type(config).from_dict(config.to_dict())
    export_config.use_cache = True
    export_config.dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    export_config.save_pretrained(out)
    GenerationConfig(
        eos_token_id=config.eos_token_id, bos_token_id=config.bos_token_id, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
