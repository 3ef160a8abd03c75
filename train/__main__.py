"""``python -m train --config FILE.yaml [key.sub=value ...]``: run on every rank (torchrun or our Slurm launcher).

The config and the parallel layout are validated from the environment variables before
any process group is created; a problem exits with status 2 and one line on stderr.
Exit codes follow `hpc.requeue`: 0 done, 1 failed, 2 bad input, 75 stopped by a notice
with a checkpoint saved.
"""

from __future__ import annotations

import os
import sys

from train.preempt import StopFlag


def main(argv: list[str] | None = None) -> int:
    stop = StopFlag()  # before the heavy imports: Slurm may send the pre-stop signal early
    from hpc.cli import Parser
    from hpc.ownership import OwnershipError, claim
    from hpc.requeue import EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED, EXIT_STOPPED, JOB_NAME_VAR
    from train.config import ConfigError, load_config
    from train.parallel import ParallelDims, WorldEnv

    parser = Parser(prog="python -m train", description="Train Qwen3 with dp x tp (FSDP2 + tensor parallel).")
    parser.add_argument("--config", required=True, help="YAML config, e.g. train/configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. parallel.tp=2 optim.lr=1e-3")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        cfg.check_paths()
        env = WorldEnv.from_env()
        dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads())
        dims.grad_accum(cfg.global_batch, cfg.micro_batch)
        job_name = os.environ.get(JOB_NAME_VAR, "")
        claim(cfg.log.dir, job_name, "log.dir")
        claim(cfg.checkpoint_dir, job_name, "checkpoint.dir")
    except (ConfigError, OwnershipError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    import torch.distributed as dist

    from train.checkpoint import CheckpointError
    from train.loop import Trainer
    from train.parallel import init_distributed

    device = init_distributed(env)
    try:
        stop.join(dist.new_group(backend="gloo"))
        step = Trainer(cfg, dims, env, device).run(stop_requested=stop.agreed)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CheckpointError as e:
        if env.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        stop.ignore_further()
        dist.destroy_process_group()
    if step >= cfg.steps:
        return EXIT_DONE
    if env.rank == 0:
        print(f"[preempt] stopped at step {step} of {cfg.steps} after {stop.received}, checkpoint saved", flush=True)
    return EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main())
