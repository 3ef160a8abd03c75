"""What the one-GPU benchmarks share: the trainer on one rank, and timing a step function."""

from __future__ import annotations

import time


def one_rank_trainer(cfg, run_id: str = "bench"):
    """``train.loop.Trainer`` for ``cfg`` on one rank (a process group of its own); returns it with its start-up
    seconds."""
    from train.loop import Trainer
    from train.parallel import ParallelDims, WorldEnv, init_distributed

    env = WorldEnv(rank=0, local_rank=0, world_size=1, local_world_size=1)
    device = init_distributed(env)
    dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads(), num_experts=cfg.model.num_experts())
    t0 = time.perf_counter()
    trainer = Trainer(cfg, dims, env, device, run_id=run_id)
    return trainer, time.perf_counter() - t0


def timed(step, warmup: int, steps: int) -> tuple[float, float]:
    """Run ``step()`` ``warmup`` then ``steps`` times; (seconds of the timed steps, seconds of the warm-up), each
    between device synchronizations."""
    import torch

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, warm
