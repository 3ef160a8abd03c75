"""``python -m train --config FILE.yaml [key.sub=value ...]``: run on every rank (torchrun or our Slurm launcher).

The config and the parallel layout are validated from the environment variables before
any process group is created; a problem exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from train.preempt import StopFlag


def main(argv: list[str] | None = None) -> int:
    stop = StopFlag()  # before the heavy imports: Slurm may send the pre-stop signal early
    from hpc.requeue import REQUEUE_EXIT, RequeueRefused, requeue
    from train.config import ConfigError, load_config
    from train.parallel import ParallelDims, WorldEnv

    parser = argparse.ArgumentParser(prog="python -m train", description="Train Qwen3 with dp x tp (FSDP2 + tensor parallel).")
    parser.add_argument("--config", required=True, help="YAML config, e.g. train/configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. parallel.tp=2 optim.lr=1e-3")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        env = WorldEnv.from_env()
        dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads())
        dims.grad_accum(cfg.global_batch, cfg.micro_batch)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import torch.distributed as dist

    from train.loop import Trainer
    from train.parallel import init_distributed

    device = init_distributed(env)
    try:
        step = Trainer(cfg, dims, env, device).run(stop_requested=lambda: stop.agreed(device))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        stop.ignore_further()
        dist.destroy_process_group()
    if step == cfg.steps:
        return 0
    # stopped early by a signal, with a checkpoint saved: rank 0 asks Slurm to run the job again
    if env.rank != 0:
        return REQUEUE_EXIT
    try:
        print(f"[preempt] stopped at step {step} after {stop.received}; {requeue(os.environ)}", flush=True)
        return REQUEUE_EXIT
    except RequeueRefused as e:
        print(f"[preempt] stopped at step {step} after {stop.received}, checkpoint saved; {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
