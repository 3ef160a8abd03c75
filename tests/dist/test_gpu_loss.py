"""The fused linear cross-entropy's CUDA path (the compiled chunk kernel; the head's gradient accumulated in the matrix
product's fp32 output) against cross_entropy on the full fp32 logits. Only on a GPU machine; here because Triton
compiles in other processes."""

from __future__ import annotations

import pytest
import torch

from train.loss import linear_cross_entropy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_cuda_linear_cross_entropy_matches_full_logits(dtype, tol):
    torch.manual_seed(0)
    hidden, weight, labels = torch.randn(37, 16), 0.3 * torch.randn(50, 16), torch.randint(0, 50, (37,))
    labels[3] = -100  # not counted
    ref_inputs = (hidden.clone().requires_grad_(), weight.clone().requires_grad_())
    ref = torch.nn.functional.cross_entropy(ref_inputs[0] @ ref_inputs[1].t(), labels)
    ref_grads = torch.autograd.grad(ref, ref_inputs)
    inputs = (hidden.cuda().to(dtype).requires_grad_(), weight.cuda().to(dtype).requires_grad_())
    loss = linear_cross_entropy(*inputs, labels.cuda(), chunk=8)
    grads = torch.autograd.grad(0.5 * loss, inputs)
    assert abs(loss.item() - ref.item()) <= tol
    for g, r in zip(grads, ref_grads, strict=True):
        assert g.dtype == dtype
        assert torch.allclose(2 * g.float().cpu(), r, atol=tol), (2 * g.float().cpu() - r).abs().max()
