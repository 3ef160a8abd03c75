"""FP8 training of the decoder's linear layers (``fp8.enabled``), through torchao's float8 training.

The seven projections of every decoder layer (q, k, v, o, gate, up, down) become torchao
``Float8Linear``: each forward and backward matrix product casts its operands to float8
with dynamic scales and accumulates in higher precision; the weights, their gradients and
the optimizer state keep their dtypes. The embeddings, norms and lm_head stay in the
compute dtype. Recipes: ``tensorwise`` (one scale per tensor; under FSDP over dp > 1 the
parameters are all-gathered in float8, half the bytes of bf16, their scales computed after
each optimizer step in one all-reduce by ``precompute_weight_scales``) and ``rowwise`` (one
scale per row: finer, but slower on H100/H200 with torchao 0.17). The conversion comes first in
``train.parallel.parallelize``'s order, so tensor parallelism shards the float8 modules
(plain column/row-wise plans: the TP inputs are replicated, there is no sequence-parallel
all-gather to do in float8) and each compiled block holds its float8 casts.

Needs a CUDA GPU of compute capability 8.9 or newer (float8 tensor cores) and torchao
(``pip install 'hpc-train[fp8]'``); elsewhere the run stops with a one-line ConfigError.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from train.front.config import ConfigError

# float8 matrix products need both dimensions of a weight to be multiples of 16
_ALIGN = 16


def require_fp8(device_type: str) -> None:
    """Raise a one-line ConfigError unless this rank can train in float8 (a CUDA GPU of capability >= 8.9, torchao)."""
    if device_type != "cuda":
        raise ConfigError(
            f"fp8.enabled=true needs a CUDA GPU of compute capability 8.9 or newer (H100, H200, L40S, ...); this run "
            f"is on {device_type}"
        )
    capability = torch.cuda.get_device_capability()
    if capability < (8, 9):
        raise ConfigError(
            f"fp8.enabled=true needs a GPU of compute capability 8.9 or newer; {torch.cuda.get_device_name()} has "
            f"{capability[0]}.{capability[1]}"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise ConfigError("fp8.enabled=true needs torchao: pip install 'hpc-train[fp8]'") from None


def convert_decoder_linears(
    layers: nn.Module, recipe: str, *, float8_all_gather: bool, emulate: bool = False, only_frozen: bool = False
) -> list[str]:
    """Swap the nn.Linear modules inside ``layers`` (the decoder layers) whose dimensions are multiples of 16 for
    torchao
    Float8Linear in place; returns their names relative to ``layers``. ``float8_all_gather`` (tensorwise only): FSDP
    all-gathers these weights in float8. ``emulate``: float8 rounding with high-precision matrix products (runs on CPU).
    ``only_frozen``: only linears whose weight is frozen (LoRA's bases; their adapters stay in high precision)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = dataclasses.replace(
        Float8LinearConfig.from_recipe_name(recipe), enable_fsdp_float8_all_gather=float8_all_gather, emulate=emulate
    )
    converted: list[str] = []

    def eligible(module: nn.Module, name: str) -> bool:
        ok = isinstance(module, nn.Linear) and all(d % _ALIGN == 0 for d in module.weight.shape)
        ok = ok and not (only_frozen and module.weight.requires_grad)
        if ok:
            converted.append(name)
        return ok

    convert_to_float8_training(layers, config=config, module_filter_fn=eligible)
    return converted


def precompute_weight_scales(model: nn.Module) -> None:
    """After an optimizer step under FSDP with float8 all-gather: every float8 weight's scale from one all-reduce,
    instead
    of one all-reduce per weight at its all-gather. A no-op for a model without such weights."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
