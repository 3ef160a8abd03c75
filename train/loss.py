"""Cross-entropy of a linear head that never holds the [tokens x vocab] logits.

Tokens are processed in chunks: each chunk's logits are computed, turned into its loss and
its logit gradient (softmax minus one-hot) and dropped, so the gradients of the hidden
states and of the head's weight are finished in the forward pass and only scaled in the
backward. Peak extra memory is one chunk's logits instead of all of them in fp32. Tokens
labelled ``IGNORE`` (-100: outside the loss, e.g. prompts and padding) add nothing to the loss or
the gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from train.front.interface import LOSS_CHUNK_TOKENS as CHUNK_TOKENS

IGNORE = -100


def chunk_loss_grad(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Summed cross-entropy of a chunk's counted tokens (computed in fp32) and its gradient w.r.t. the logits, in the
    logits' dtype."""
    x = logits.float()
    counted = labels != IGNORE
    safe = torch.where(counted, labels, 0)
    lse = torch.logsumexp(x, dim=-1)
    loss = torch.where(counted, lse - x.gather(1, safe[:, None]).squeeze(1), 0.0).sum()
    target = torch.arange(x.shape[1], device=x.device)[None, :] == safe[:, None]
    grad = (torch.exp(x - lse[:, None]) - target.to(x.dtype)) * counted[:, None].to(x.dtype)
    return loss, grad.to(logits.dtype)


_compiled_chunk_loss_grad: Callable | None = None


def _chunk_fn(device: torch.device) -> Callable:
    """On CUDA a compiled chunk_loss_grad (one fused pass over the logits), elsewhere the eager one."""
    global _compiled_chunk_loss_grad
    if device.type != "cuda":
        return chunk_loss_grad
    if _compiled_chunk_loss_grad is None:
        _compiled_chunk_loss_grad = torch.compile(chunk_loss_grad, dynamic=False)
    return _compiled_chunk_loss_grad


def _add_product(acc: Tensor | None, a: Tensor, b: Tensor) -> Tensor:
    """``acc + a @ b`` in fp32 (``a @ b`` when ``acc`` is None). On CUDA the matrix product writes its fp32
    accumulator into ``acc`` itself (cuBLAS, bf16 inputs); elsewhere the product is added in a second pass."""
    if a.is_cuda:
        if acc is None:
            return torch.mm(a, b, out_dtype=torch.float32)
        return torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    product = a @ b
    return product.float() if acc is None else acc.add_(product)  # add_ upcasts in its one pass


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, chunk: int, divisor: Tensor | float) -> Tensor:
        n = hidden.shape[0]
        fn = _chunk_fn(hidden.device)
        # a frozen head (LoRA) gets no weight gradient: neither its product nor its fp32 [V, H] accumulator
        weight_grad = ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden)
        grad_weight = None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk):
            h, y = hidden[start : start + chunk], labels[start : start + chunk]
            chunk_loss, g = fn(h @ weight.t(), y)
            loss += chunk_loss
            grad_hidden[start : start + chunk] = g @ weight
            if weight_grad:
                grad_weight = _add_product(grad_weight, g.t(), h)
        grad_weight = grad_weight.div_(divisor).to(weight.dtype) if weight_grad else None
        ctx.save_for_backward(grad_hidden.div_(divisor), grad_weight)
        return loss / divisor

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_weight = None if grad_weight is None else grad_weight * grad_out.to(grad_weight.dtype)
        return grad_hidden * grad_out.to(grad_hidden.dtype), grad_weight, None, None, None


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, labels: Tensor, chunk: int = CHUNK_TOKENS, reduction: str = "mean"
) -> Tensor:
    """Cross-entropy of ``hidden @ weight.T`` ([N, H] x [V, H]) against ``labels`` [N] (``IGNORE`` = not counted),
    computed in
    chunks of tokens: the mean over the counted tokens (``reduction="mean"``) or their sum (``"sum"``)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r}: allowed: mean, sum")
    divisor = (labels != IGNORE).sum().clamp(min=1).to(torch.float32) if reduction == "mean" else 1.0
    return _LinearCrossEntropy.apply(hidden, weight, labels, chunk, divisor)
