"""``python -m train --config FILE.yaml [key.sub=value ...]``: run on every rank (torchrun or our Slurm launcher).

The config and the parallel layout are validated from the environment variables before any process group is
created; exit codes follow `hpc.node.contract`: 0 done, 1 failed, 2 bad input (one line), 75 stopped with a checkpoint.
"""

from __future__ import annotations

import os
import sys

from train.preempt import StopFlag

PROG = "train"


def main(argv: list[str] | None = None) -> int:
    stop = StopFlag()  # before the heavy imports: Slurm may send the pre-stop signal early
    from hpc.node.cli import HpcError, Parser, error_line
    from hpc.node.contract import EXIT_DONE, EXIT_FAILED, EXIT_STOPPED, JOB_NAME_VAR
    from hpc.node.ownership import claim
    from train.config import load_config
    from train.parallel import ParallelDims, WorldEnv

    parser = Parser(prog=PROG, description="Train Qwen3 with dp x tp (FSDP2 + tensor parallel).")
    parser.add_argument("--config", required=True, help="YAML config, e.g. train/configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. parallel.tp=2 optim.lr=1e-3")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        cfg.check_paths()
        env = WorldEnv.from_env()
        dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads(), num_experts=cfg.model.num_experts())
        dims.grad_accum(cfg.global_batch, cfg.micro_batch)
        job_name = os.environ.get(JOB_NAME_VAR, "")
        claim(cfg.log.dir, job_name, "log.dir")
        claim(cfg.checkpoint_dir, job_name, "checkpoint.dir")
    except HpcError as e:
        print(error_line(PROG, e), file=sys.stderr)
        return e.code

    import torch.distributed as dist

    from train.loop import Trainer
    from train.parallel import init_distributed

    device = init_distributed(env)
    try:
        stop.join(dist.new_group(backend="gloo"))
        step = Trainer(cfg, dims, env, device).run(stop_requested=stop.agreed)
    except HpcError as e:
        if e.code != EXIT_FAILED or env.rank == 0:  # a failed save or load is the same line on every rank
            print(error_line(PROG, e), file=sys.stderr)
        return e.code
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
