"""A rank's part of a full tensor: what a shard (a DTensor parameter under FSDP2 x TP x EP) holds of it."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


def local_part(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The part of ``full`` that ``like`` (a DTensor shard of a tensor of full's shape, or a plain tensor: all of it)
    holds."""
    if not isinstance(like, DTensor):
        return full
    shape, offset = compute_local_shape_and_global_offset(full.shape, like.device_mesh, like.placements)
    return full[tuple(slice(o, o + n) for n, o in zip(shape, offset, strict=False))]


@torch.no_grad()
def fill(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of ``full`` into ``param`` (a shard or a whole tensor), in place."""
    local = param.to_local() if isinstance(param, DTensor) else param
    local.copy_(local_part(full, param))
