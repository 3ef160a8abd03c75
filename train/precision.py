"""Mixed precision for a job of one rank, where FSDP (which casts for the others) is left out.

The model that computes holds bf16 parameters; an fp32 twin (same modules, not compiled)
holds the weights the optimizer updates and checkpoints save. As soon as the backward has
accumulated a parameter's bf16 gradient, it is added into the twin's fp32 one and freed,
so no more than a few bf16 gradients are alive at once; after each optimizer step the twin's
weights are cast into the model. This is what FSDP's MixedPrecisionPolicy (param_dtype bf16,
reduce_dtype fp32) does on one rank, without its per-layer copies.
"""

from __future__ import annotations

import torch
from torch import nn


class MasterWeights:
    """The fp32 ``master`` module's parameters paired with the computing ``model``'s, in module order; from
    construction on, every gradient the model's backward produces lands in the master's fp32 ``.grad``."""

    def __init__(self, model: nn.Module, master: nn.Module):
        self.params = list(model.parameters())
        self.masters = list(master.parameters())
        if [p.shape for p in self.params] != [m.shape for m in self.masters]:
            raise ValueError("model and master must have the same parameters")
        for p, m in zip(self.params, self.masters, strict=False):
            p.register_post_accumulate_grad_hook(self._folder(m))

    @staticmethod
    def _folder(master: nn.Parameter):
        @torch.no_grad()
        def fold(param: torch.Tensor) -> None:
            if master.grad is None:
                master.grad = param.grad.to(master.dtype)
            else:
                master.grad.add_(param.grad)
            param.grad = None

        return fold

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Cast the master weights into the model (after an optimizer step or a load)."""
        torch._foreach_copy_(self.params, self.masters)
