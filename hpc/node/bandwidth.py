"""all_reduce bandwidth sweeps over torch.distributed groups, as nccl-tests define them.

algbw = bytes / time; busbw = algbw x 2(n-1)/n for n ranks, the rate each link must carry,
comparable across group sizes. A time is the slowest rank's mean over `iters` back-to-back
all_reduces after `warmup` untimed ones. Only torch is needed (the GPU bench imports this).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:  # torch is imported where it runs: the login-side commands that use this module start fast
    import torch


GB = 1e9  # nccl-tests' GB/s
MAX_BYTES = 2**40  # the largest message size and the most iterations a flag may ask for
MAX_ITERS = 10**6


def size_ladder(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes (always included)."""
    if not 0 < min_bytes <= max_bytes or factor < 2:
        raise ValueError(f"sizes {min_bytes}..{max_bytes} x{factor}: need 0 < min <= max and factor >= 2")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes


def human_bytes(n: float) -> str:
    """4096 -> '4 KB', 1073741824 -> '1 GB' (binary units)."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GB"


def bus_factor(n: int) -> float:
    """busbw / algbw for all_reduce over n ranks (0 for one rank: nothing crosses a link)."""
    return 2 * (n - 1) / n


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_all_reduce(x: torch.Tensor, group, iters: int, warmup: int) -> float:
    """Seconds per all_reduce of x over group: the slowest member's mean."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        dist.all_reduce(x, group=group)
    _sync(x.device)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x, group=group)
    _sync(x.device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=x.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def sweep(
    sizes: list[int],
    device: torch.device,
    group=None,
    iters: int = 5,
    warmup: int = 2,
    progress: Optional[Callable[[dict], None]] = None,
) -> list[dict]:
    """One row per size: bytes, time_us, algbw_gbps, busbw_gbps (float32 elements)."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        t = time_all_reduce(x, group, iters, warmup)
        algbw = x.numel() * 4 / t / GB
        row = {"bytes": x.numel() * 4, "time_us": t * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(n)}
        rows.append(row)
        if progress:
            progress(row)
        del x
    return rows


def copy_bandwidth(sizes: list[int], device: torch.device, iters: int = 10, warmup: int = 2) -> list[dict]:
    """Device-local copy rate per size: bytes read plus written per second (a single-device ceiling)."""
    import torch

    rows = []
    for nbytes in sizes:
        src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        for _ in range(warmup):
            dst.copy_(src)
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        _sync(device)
        t = (time.perf_counter() - start) / iters
        rows.append({"bytes": src.numel() * 4, "time_us": t * 1e6, "copy_gbps": 2 * src.numel() * 4 / t / GB})
        del src, dst
    return rows
