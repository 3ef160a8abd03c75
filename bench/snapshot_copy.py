"""The cost of copying one rank's training state to host memory while the GPU trains: an 8B model's shard.

    python bench/snapshot_copy.py [--params 8.19e9] [--dp 8 16] [--chunk-mib 256] [--out FILE.json]

The shard is what one rank of an FSDP job holds of Qwen3-8B: fp32 master weights and AdamW's two moments (12 bytes
per parameter) over dp ranks. Measured on this GPU, each printed as one JSON object:
  * pinned buffer allocation (once per job), a blocking copy to pinned and to pageable memory (GB/s);
  * the copy on a side stream, in chunks, started with bf16 matrix products on the default stream that last about
    twice the copy (a step's work): the products' TFLOP/s alone and with the copy, and the copy's time under load;
  * bytes per step sent to a partner node at a copy every N steps.
"""

from __future__ import annotations

import argparse
import time

import torch
from one_gpu import emit  # bench/, first on sys.path as the script runs

BYTES_PER_PARAM = 12  # fp32 weight + AdamW exp_avg + exp_avg_sq


def _sync_copy(src: torch.Tensor, dst: torch.Tensor) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=dst.is_pinned())
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _products(a: torch.Tensor, b: torch.Tensor, k: int, side=None) -> tuple[float, float]:
    """``k`` bf16 products on the default stream; ``side()`` starts with them on another stream. Returns the
    products' seconds and the side work's (0 without one), from CUDA events."""
    torch.cuda.synchronize()
    start, mm_end, side_end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    if side is not None:
        stream = torch.cuda.Stream()
        stream.wait_event(start)
        with torch.cuda.stream(stream):
            side()
            side_end.record(stream)
    for _ in range(k):
        a @ b
    mm_end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(mm_end) / 1e3, (start.elapsed_time(side_end) / 1e3 if side is not None else 0.0)


def measure(params: float, dp: int, chunk_mib: int) -> dict:
    shard = int(params * BYTES_PER_PARAM / dp)
    n = shard // 4
    src = torch.randn(n, device="cuda")
    t0 = time.perf_counter()
    pinned = torch.empty(n, pin_memory=True)
    alloc_s = time.perf_counter() - t0
    pageable = torch.empty(n)
    pageable.fill_(0)  # touch the pages first, as a reused buffer is
    pin_s = min(_sync_copy(src, pinned) for _ in range(3))
    page_s = min(_sync_copy(src, pageable) for _ in range(2))
    assert torch.equal(pinned[:1024], src[:1024].cpu())
    del pageable

    chunk = chunk_mib * (1 << 20) // 4

    def copy_chunks() -> None:
        for i in range(0, n, chunk):
            pinned[i : i + chunk].copy_(src[i : i + chunk], non_blocking=True)

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    one, _ = _products(a, b, 50)  # warm up; 50 products' time
    k = max(50, int(50 * 2 * pin_s / one))  # products lasting about twice the copy
    alone, _ = _products(a, b, k)
    during, copy_s = _products(a, b, k, side=copy_chunks)
    flop = 2 * 8192**3 * k
    assert torch.equal(pinned[-1024:], src[-1024:].cpu())
    gb = shard / 1e9
    return {
        "dp": dp,
        "shard_GB": round(gb, 2),
        "pinned_alloc_s": round(alloc_s, 2),
        "blocking_pinned_s": round(pin_s, 3),
        "blocking_pinned_GBps": round(gb / pin_s, 1),
        "blocking_pageable_s": round(page_s, 3),
        "blocking_pageable_GBps": round(gb / page_s, 1),
        "side_stream_copy_under_matmul_s": round(copy_s, 3),
        "products_TFLOPs_alone": round(flop / alone / 1e12, 1),
        "products_TFLOPs_with_copy": round(flop / during / 1e12, 1),
        "products_slowdown": round(during / alone, 3),
        "partner_MB_per_step": {str(every): round(shard / every / 1e6, 1) for every in (10, 50, 100)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=8.19e9)
    ap.add_argument("--dp", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--out")
    a = ap.parse_args()
    report = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "params": a.params,
        "bytes_per_param": BYTES_PER_PARAM,
        "chunk_MiB": a.chunk_mib,
        "runs": [],
    }
    for dp in a.dp:
        report["runs"].append(measure(a.params, dp, a.chunk_mib))
        torch.cuda.empty_cache()
    emit(report, a.out)


if __name__ == "__main__":
    main()
