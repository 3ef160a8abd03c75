"""LoRA and QLoRA adapters on the decoder's projections (``lora:``), in PEFT's layout and key names.

``apply_lora`` (first step of ``train.parallel.parallelize``) freezes the whole model and wraps each target
``nn.Linear`` in a ``LoraLinear``: the frozen ``base_layer`` plus ``lora_A`` (in -> r) and ``lora_B`` (r -> out),
output ``base(x) + scaling * B(A(dropout(x)))`` with scaling alpha / r (alpha / sqrt(r) with rslora). Tensor
parallelism then shards the adapters with their base (``tp_plan``): a column-wise base gets A replicated and B
column-wise, a row-wise base gets A row-wise (its output all-reduced) and B replicated; each adapter is its own TP
module, so every gradient is complete where it lands. The initial A (Kaiming-uniform, as PEFT) and B (zeros) come
from a generator seeded with ``seed`` that every rank runs, each keeping its shard: the same for every dp x tp layout.

QLoRA (``lora.quantize_base: nf4``) stores the frozen base projections as torchao ``NF4Tensor`` (4-bit NormalFloat,
blocks of 64, dequantized to the compute dtype in each product; runs on CPU and GPU).

Checkpoints hold only trainable parameters (the adapters), their AdamW state, the data position and RNG; ``meta``
records what they fit (r, alpha, targets, rslora, quantization, the base). ``export_adapter`` writes a PEFT adapter
directory (``adapter_config.json``, ``adapter_model.safetensors`` with PEFT's key names for Qwen3ForCausalLM) that
``peft.PeftModel.from_pretrained`` and vLLM's ``--enable-lora`` load; ``merged_state`` folds the adapters into the base
for a full Hugging Face export.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.parallel.style import ParallelStyle

from train.front.config import ConfigError, LoraConfig
from train.front.run_check import NF4_BLOCK, missing_target, nf4_block_problem
from train.shards import fill

PEFT_PREFIX = "base_model.model."  # PEFT's key prefix for a Qwen3ForCausalLM's adapters
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


class LoraLinear(nn.Module):
    """A frozen ``base_layer`` (nn.Linear) plus the low-rank update ``scaling * lora_B(lora_A(dropout(x)))``."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float, use_rslora: bool, dtype: torch.dtype):
        super().__init__()
        self.base_layer = base
        kw = {"bias": False, "device": base.weight.device, "dtype": dtype}
        self.lora_A = nn.Linear(base.in_features, r, **kw)
        self.lora_B = nn.Linear(r, base.out_features, **kw)
        self.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scaling = alpha / (math.sqrt(r) if use_rslora else r)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        x = self.lora_dropout(x)
        if self.lora_A.weight.dtype == x.dtype:  # FSDP casts the adapters, or one dtype everywhere
            return out + self.lora_B(self.lora_A(x)) * self.scaling
        # one rank, fp32 adapters under bf16 compute (no TP here): the products in the compute dtype, fp32 gradients
        a, b = self.lora_A.weight.to(x.dtype), self.lora_B.weight.to(x.dtype)
        return out + F.linear(F.linear(x, a), b) * self.scaling


def apply_lora(model: nn.Module, cfg: LoraConfig, adapter_dtype: torch.dtype) -> list[str]:
    """Freeze ``model`` and wrap the target projections of every decoder layer in LoraLinear (in place; on any
    device, meta included). Returns the wrapped modules' names; a target missing from a layer is a ConfigError."""
    wrapped = []
    for i, layer in enumerate(model.model.layers):
        linears = {name.rsplit(".", 1)[-1]: name for name, m in layer.named_modules() if isinstance(m, nn.Linear)}
        for target in cfg.target_modules:
            if target not in linears:  # train.front.run_check refuses it first, from the config's fields
                raise ConfigError(missing_target(target, i, linears))
            parent_name, _, leaf = linears[target].rpartition(".")
            parent = layer.get_submodule(parent_name)
            setattr(
                parent,
                leaf,
                LoraLinear(getattr(parent, leaf), cfg.r, cfg.alpha, cfg.dropout, cfg.use_rslora, adapter_dtype),
            )
            wrapped.append(f"model.layers.{i}.{linears[target]}")
    freeze_base(model)
    return wrapped


def freeze_base(model: nn.Module) -> None:
    """Only the adapters train (again after TP, whose SequenceParallel registers the norms' weights as trainable)."""
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_key(name))


class ReplicateParallel(ParallelStyle):
    """Parameters replicated over the TP mesh (DTensors), local tensors in and out."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def partition(_name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for key, param in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(
                    key, nn.Parameter(distribute_tensor(param, mesh, [Replicate()]), requires_grad=param.requires_grad)
                )

        def inputs(_mod, args, mesh):
            return tuple(DTensor.from_local(a, mesh, (Replicate(),), run_check=False) for a in args)

        return distribute_module(module, device_mesh, partition, inputs, lambda _mod, out, _mesh: out.to_local())


def tp_plan(layer_plan: dict[str, ParallelStyle], layer: nn.Module) -> dict[str, ParallelStyle]:
    """The decoder layer's TP plan with each LoraLinear's base sharded as planned and its adapters to match."""
    plan = {}
    for name, style in layer_plan.items():
        if not isinstance(layer.get_submodule(name), LoraLinear):
            plan[name] = style
        elif isinstance(style, ColwiseParallel):
            plan |= {
                f"{name}.base_layer": style,
                f"{name}.lora_A": ReplicateParallel(),
                f"{name}.lora_B": ColwiseParallel(),
            }
        elif isinstance(style, RowwiseParallel):
            plan |= {
                f"{name}.base_layer": style,
                f"{name}.lora_A": RowwiseParallel(),
                f"{name}.lora_B": ReplicateParallel(),
            }
        else:
            raise ValueError(f"no LoRA sharding for {name}'s {type(style).__name__}")
    return plan


def is_adapter_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


def hf_key(key: str) -> str:
    """The Hugging Face name of a model key (a wrapped projection's ``base_layer`` is the projection itself)."""
    return key.replace(".base_layer.", ".")


@torch.no_grad()
def init_adapters(model: nn.Module, seed: int) -> None:
    """A: Kaiming-uniform (a=sqrt(5), as nn.Linear and PEFT), B: zeros. Every rank draws every A in module order from
    one CPU generator seeded with ``seed`` in fp32 and keeps its shard: the same adapters for every dp x tp layout,
    with no collective."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, LoraLinear):
            a = module.lora_A.weight
            bound = 1 / math.sqrt(a.shape[1])  # kaiming_uniform_ with a=sqrt(5)
            fill(a, torch.empty(a.shape).uniform_(-bound, bound, generator=gen).to(a.device))
            fill(module.lora_B.weight, torch.zeros(module.lora_B.weight.shape, device=a.device))


# torchao's NF4 home: torchao >= 0.18 moved it from torchao.dtypes.nf4tensor (0.17 and earlier)
NF4_MODULES = ("torchao.quantization.quantize_.workflows.nf4.nf4_tensor", "torchao.dtypes.nf4tensor")


def nf4_api():
    """torchao's ``(NF4Tensor, to_nf4)`` from whichever home the installed torchao has; a ConfigError naming the
    cause."""
    import importlib

    try:
        import torchao
    except ImportError as e:
        if e.name and e.name.split(".")[0] == "torchao":
            raise ConfigError("lora.quantize_base=nf4 needs torchao: pip install 'hpc-train[fp8]'") from None
        raise ConfigError(f"lora.quantize_base=nf4: torchao is installed but does not import ({e})") from None
    for name in NF4_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return module.NF4Tensor, module.to_nf4
    raise ConfigError(
        f"lora.quantize_base=nf4: torchao {getattr(torchao, '__version__', '?')} has NF4 in none of "
        f"{', '.join(NF4_MODULES)}; install torchao>=0.17"
    )


def nf4_scaler_block(numel: int) -> int:
    """The scaler block (<= 256, as QLoRA's double quantization) that divides the weight's count of NF4 blocks."""
    return math.gcd(256, numel // NF4_BLOCK)


def nf4_weight(w: torch.Tensor, name: str):
    """The frozen base projection ``name``'s weight as an NF4Tensor (blocks of NF4_BLOCK; the block rule's
    ConfigError)."""
    problem = nf4_block_problem(name, tuple(w.shape))  # train.front.run_check refuses it first
    if problem:
        raise ConfigError(problem)
    _, to_nf4 = nf4_api()
    return to_nf4(w, NF4_BLOCK, nf4_scaler_block(w.numel()))


def base_identity(model_path: str | None, shape: str | None, dims: dict, seed: int) -> dict:
    """What the adapters were trained on: the HF directory, or the named shape, its dims and the init seed."""
    if model_path is not None:
        return {"path": str(Path(model_path).resolve())}
    return {"shape": shape, "dims": dims, "seed": seed}


def lora_meta(cfg: LoraConfig | None, base: dict) -> dict | None:
    """The checkpoint meta's ``lora`` entry: the settings an adapter checkpoint only fits with (None: full
    fine-tune)."""
    if cfg is None or not cfg.enabled:
        return None
    return {
        "r": cfg.r,
        "alpha": cfg.alpha,
        "target_modules": sorted(cfg.target_modules),
        "use_rslora": cfg.use_rslora,
        "quantize_base": cfg.quantize_base,
        "base": base,
    }


def _full_adapters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every adapter weight in full on rank 0's CPU (empty elsewhere; collective)."""
    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    )
    return {k: v for k, v in state.items() if is_adapter_key(k)}


def export_adapter(model: nn.Module, cfg: LoraConfig, base_name: str, out_dir: Path) -> None:
    """Write a PEFT adapter directory: adapter_model.safetensors (PEFT's key names) + adapter_config.json.
    Collective."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(
        logging.ERROR
    )  # gathering dp x tp shards warns
    state = _full_adapters(model)
    if dist.get_rank() != 0:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {PEFT_PREFIX + k: v.contiguous() for k, v in sorted(state.items())}
    save_file(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": cfg.r,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(cfg.target_modules),
        "use_rslora": cfg.use_rslora,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
    }
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))


def merged_state(state: dict[str, torch.Tensor], cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """A full model state dict (adapters included) as Hugging Face weights: W + scaling * B @ A under each projection's
    name, in W's dtype (an NF4 base dequantized to its original dtype)."""
    scaling = cfg.alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)
    merged = {}
    for key, value in state.items():
        if is_adapter_key(key):
            continue
        if ".base_layer." in key and key.endswith(".weight"):
            prefix = key.removesuffix("base_layer.weight")
            if hasattr(value, "get_original_weight"):  # an NF4Tensor: dequantize
                value = value.get_original_weight()
            delta = state[prefix + "lora_B.weight"].float() @ state[prefix + "lora_A.weight"].float()
            value = (value.float() + scaling * delta).to(value.dtype)
        merged[hf_key(key)] = value
    return merged
