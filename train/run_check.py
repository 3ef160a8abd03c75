"""The trainer's check of one run, torch-free: ``python -m train`` runs it first on every rank, and the login side
runs it for every job (each array task) before anything is submitted, so both refuse the same input with the same line."""
from __future__ import annotations

from train.config import TrainConfig
from train.layout import ParallelDims, WorldEnv


def check_run(cfg: TrainConfig, env: WorldEnv) -> ParallelDims:
    """The files the run reads and writes and its parallel layout for ``env``'s ranks; raises an HpcError (one line)."""
    cfg.check_paths()
    dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads(), num_experts=cfg.model.num_experts())
    dims.grad_accum(cfg.global_batch, cfg.micro_batch)
    return dims
