"""Where one training step's GPU time goes: the trainer on one GPU under torch.profiler, kernels by kind.

    python bench/profile_step.py --shape 1.7B [--micro-batch 4] [--global-batch 4] [--steps 2] [--set key=value ...]

Prints one JSON object: the step's wall time, the time the GPU ran any kernel (the union of
their intervals; the rest is idle, i.e. waiting for the host), the seconds per kind of kernel
(matrix products, attention, compiled/fused elementwise, optimizer, copies and casts,
communication, other) and the top kernels by total time, and the peak memory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hpc.node.cli import Parser, whole

KINDS = [  # first match wins
    ("communication", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|cudnn", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|sm90_", re.I)),
    ("compiled", re.compile(r"^triton_", re.I)),
    ("copy/cast", re.compile(r"copy|memcpy|memset|cast|fill|direct_copy", re.I)),
]


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def main() -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1.7B")
    p.add_argument("--seq-len", type=whole(1), default=4096)
    p.add_argument("--micro-batch", type=whole(1), default=4)
    p.add_argument("--global-batch", type=whole(1), default=None, help="default: the micro-batch (no accumulation)")
    p.add_argument("--warmup", type=whole(0), default=4)
    p.add_argument("--steps", type=whole(1), default=2, help="profiled steps")
    p.add_argument("--top", type=whole(1), default=15)
    p.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="trainer config overrides, e.g. master_dtype=bf16"
    )
    args = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from train.front.config import TrainConfig, apply_overrides
    from train.loop import Trainer
    from train.parallel import ParallelDims, WorldEnv, init_distributed
    from train.steptime import busy_seconds

    with tempfile.TemporaryDirectory() as tmp:
        raw = {
            "model": {"shape": args.shape},
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "global_batch": args.global_batch or args.micro_batch,
            "steps": args.warmup + args.steps,
            "compile": True,
            "log": {"dir": tmp},
            "checkpoint": {"keep_last": 1},
        }
        cfg = TrainConfig.model_validate(apply_overrides(raw, args.set))
        env = WorldEnv(rank=0, local_rank=0, world_size=1, local_world_size=1)
        device = init_distributed(env)
        trainer = Trainer(
            cfg, ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads()), env, device, run_id="bench"
        )
        for _ in range(args.warmup):
            trainer.train_step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                trainer.train_step()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / args.steps
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_seconds([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e6 / args.steps
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        seconds = (e.time_range.end - e.time_range.start) / 1e6 / args.steps
        by_kind[kind_of(e.name)] += seconds
        by_name[e.name][0] += seconds
        by_name[e.name][1] += 1
    tokens = cfg.global_batch * cfg.seq_len
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.top]
    print(
        json.dumps(
            {
                "shape": args.shape,
                "batch": f"{cfg.global_batch} x {cfg.seq_len} (micro {cfg.micro_batch})",
                "overrides": args.set,
                "step_s": wall,
                "tokens_per_s": tokens / wall,
                "mfu": tokens / wall * trainer.flops_per_token / trainer.peak_flops_total,
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                "gpu_busy_s": busy,
                "gpu_idle_s": wall - busy,
                "by_kind_s": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
                "top_kernels": [
                    {"name": n[:120], "s_per_step": s, "calls_per_step": c / args.steps, "kind": kind_of(n)}
                    for n, (s, c) in top
                ],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
