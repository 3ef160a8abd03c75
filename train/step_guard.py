"""Stop a run whose steps went wrong before any of them is saved: a loss or gradient norm that turned non-finite, a
global batch without a loss token, weights that hold non-finite values.

``StepGuard.record`` gathers the first step of each kind on the device, every step, without waiting for it;
``StepGuard.problem`` reads them (one all-reduce over the world, so every rank stops at the same check) where the
step loop waits anyway: a metrics step and before every save.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hpc.node.cli import HpcError
from hpc.node.contract import EXIT_FAILED

_KINDS = (
    "the loss turned non-finite (nan or inf)",
    "the gradient norm turned non-finite (nan or inf)",
    "its global batch holds no loss token",
    "the weights hold non-finite values",
)


class StepFailed(HpcError):
    """A step went wrong: the run stops without saving it (exit 1)."""

    code = EXIT_FAILED


class StepGuard:
    def __init__(self, device: torch.device):
        self.first = torch.zeros(len(_KINDS), dtype=torch.int64, device=device)  # first step of each kind; 0 = none

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, loss_tokens: torch.Tensor) -> None:
        """Note what went wrong in ``step`` (device tensors: no wait)."""
        bad = torch.stack([~torch.isfinite(loss), ~torch.isfinite(grad_norm), loss_tokens == 0])
        self.first[:3] = torch.where((self.first[:3] == 0) & bad, step, self.first[:3])

    def problem(self, step: int, weights: Iterable[torch.Tensor] = ()) -> str | None:
        """What went wrong since the run (re)started, as one line, or None; ``weights`` (this rank's parameters) are
        checked too when given. Collective."""
        first = self.first.clone()
        local = [w.to_local() if isinstance(w, DTensor) else w for w in weights]
        if local and not torch.stack([torch.isfinite(w).all() for w in local]).all():
            first[3] = step
        dist.all_reduce(first, op=dist.ReduceOp.MAX)
        found = [(s, kind) for s, kind in zip(first.tolist(), _KINDS, strict=False) if s]
        if not found:
            return None
        s, kind = min(found)
        return (
            f"step {s}: {kind}; the run stops without saving any step from {s} on (lower optim.lr, set grad_clip, "
            "or check the data: seq_len, data.overlong)"
        )
