"""Mixed precision for a job of one rank, where FSDP (which casts for the others) is left out.

The model that computes holds bf16 parameters; an fp32 twin (same modules, not compiled)
holds the weights the optimizer updates and checkpoints save. After each micro-batch's
backward the bf16 gradients are added into the twin's fp32 ones; after each optimizer
step the twin's weights are cast into the model. This is what FSDP's MixedPrecisionPolicy
(param_dtype bf16, reduce_dtype fp32) does on one rank, without its per-layer copies.
"""

from __future__ import annotations

import torch
from torch import nn


class MasterWeights:
    """The fp32 ``master`` module's parameters paired with the computing ``model``'s, in module order."""

    def __init__(self, model: nn.Module, master: nn.Module):
        self.params = list(model.parameters())
        self.masters = list(master.parameters())
        if [p.shape for p in self.params] != [m.shape for m in self.masters]:
            raise ValueError("model and master must have the same parameters")

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """Add the model's gradients (this micro-batch) into the master's fp32 ones and free them."""
        into, grads = [], []
        for m, p in zip(self.masters, self.params):
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = p.grad.to(m.dtype)
            else:
                into.append(m.grad)
                grads.append(p.grad)
            p.grad = None
        if into:
            torch._foreach_add_(into, grads)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Cast the master weights into the model (after an optimizer step or a load)."""
        torch._foreach_copy_(self.params, self.masters)
