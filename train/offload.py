"""Activation offload (``activation_offload: true``): the input each checkpointed decoder layer keeps for its backward
goes to host memory instead of staying on the GPU, so the activations a step holds no longer grow with depth.

A checkpointed layer keeps only its input hidden states ([micro_batch, seq, hidden]; 36 x 134 MB for Qwen3-8B at
4 x 4096 in bf16) and recomputes the rest in its backward. Here the forward copies that input to pinned host memory on
a side stream (the GPU tensor is released once the copy is done; the compute stream never waits for it), runs the layer
without keeping anything, and the backward brings the input back (prefetching the next layer's while this one
recomputes), recomputes the layer with the forward's random state and back-propagates through it. The layer's
parameters get their gradients from that inner backward, as with reentrant checkpointing: one rank only (no FSDP;
``train.front.run_check.offload_problem``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper


class HostStore:
    """The offloaded inputs of one model's layers, by layer index: copies to host on a side stream, prefetched back in
    the reverse order of the forward."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.host: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        self.back: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}

    def put(self, index: int, x: torch.Tensor) -> None:
        if self.stream is None:
            self.host[index] = (x.detach().clone(), None)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            host.copy_(x.detach(), non_blocking=True)
            x.record_stream(self.stream)  # the GPU memory is reused only after the copy
            done = torch.cuda.Event()
            done.record(self.stream)
        self.host[index] = (host, done)

    def _fetch(self, index: int) -> None:
        if index in self.back or index not in self.host:
            return
        host, written = self.host.pop(index)
        if self.stream is None:
            self.back[index] = (host, None)
            return
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(written)
            x = host.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        self.back[index] = (x, done)

    def take(self, index: int) -> torch.Tensor:
        """Layer ``index``'s input on the device, ready for the compute stream; starts bringing back layer index -
        1's."""
        self._fetch(index)
        x, done = self.back.pop(index)
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)
            x.record_stream(torch.cuda.current_stream(self.device))
        self._fetch(index - 1)
        return x


def _rng_state(device: torch.device) -> tuple:
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


@contextlib.contextmanager
def _replayed_rng(state: tuple, device: torch.device):
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield


class _OffloadedLayer(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden: torch.Tensor, _anchor: torch.Tensor, store: HostStore, index: int, run: Callable
    ) -> torch.Tensor:
        ctx.store, ctx.index, ctx.run = store, index, run
        ctx.rng = _rng_state(hidden.device)
        store.put(index, hidden)
        with torch.no_grad():
            return run(hidden)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        hidden = ctx.store.take(ctx.index).requires_grad_(True)
        with torch.enable_grad(), _replayed_rng(ctx.rng, hidden.device):
            out = ctx.run(hidden)
        torch.autograd.backward(out, grad)
        return hidden.grad, None, None, None, None


def offload_checkpoint(layer: nn.Module, store: HostStore, index: int) -> nn.Module:
    """``layer`` (a decoder layer, compiled or not) checkpointed with its input kept in host memory. The wrapper
    (torch's checkpoint_wrapper with this checkpoint function) keeps the parameters' names."""
    # an input that requires grad, so the layer's backward runs even where the hidden states need none (a frozen
    # embedding under LoRA: the adapters of the first layer still need theirs)
    anchor = torch.empty(0, requires_grad=True)

    def checkpoint_fn(module: nn.Module, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return _OffloadedLayer.apply(hidden, anchor, store, index, lambda h: module(h, *args, **kwargs))

    return checkpoint_wrapper(layer, checkpoint_fn=checkpoint_fn)
