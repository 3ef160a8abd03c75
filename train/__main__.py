"""``python -m train --config FILE.yaml [key.sub=value ...]``: run on every rank (torchrun or our Slurm launcher).

The config and the parallel layout are validated from the environment variables before any process group is
created; exit codes follow `hpc.node.contract`: 0 done, 1 failed, 2 bad input (one line), 75 stopped with a checkpoint
(or by SIGTERM while starting, with nothing to save).
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from pathlib import Path

from hpc.node.cli import print_error, whole_lines
from hpc.node.contract import TRAINER_MODULE as PROG
from hpc.node.fault_exit import exit_code
from hpc.node.stop_flag import StopBeforeStart, StopFlag
from train.front.interface import CHECKPOINT_DIR_KEY, LOG_DIR_KEY


def main(argv: list[str] | None = None) -> int:
    # before the heavy imports: Slurm may send the pre-stop signal early; a SIGTERM before the run can stop at a step
    # boundary ends the start wherever it is (a start that blocks never outlives the job)
    stop = StopFlag(ends_start=True)
    whole_lines()  # the ranks of a node share its streams
    try:
        return _run(stop, argv)
    except StopBeforeStart as e:
        print_error(PROG, e)
        return e.code


def _run(stop: StopFlag, argv: list[str] | None) -> int:
    from hpc.node.cli import HpcError, Parser, path_text
    from hpc.node.contract import EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED, EXIT_STOPPED, JOB_NAME_VAR
    from hpc.node.lease import slurm_job_id
    from hpc.node.ownership import check_owner, claim, unclaim, unnamed_owner
    from train.data.tokenizer import load_tokenizer
    from train.front.config import load_config
    from train.front.layout import WorldEnv
    from train.front.run_check import check_run, ignored_settings
    from train.front.tokenizer import tokenizer_source

    parser = Parser(prog=f"python -m {PROG}", description="Train Qwen3 with dp x tp (FSDP2 + tensor parallel).")
    parser.add_argument("--config", required=True, type=path_text, help="YAML config, e.g. train/configs/tiny.yaml")
    parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. parallel.tp=2 optim.lr=1e-3"
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        env = WorldEnv.from_env()
        if env.local_rank == 0:  # the file this node resolved: the project's, never a train.py beside the job
            print(f"[train] trainer: {Path(__file__).resolve()}", flush=True)
        dims = check_run(cfg, env)  # the login side's check too
        _check_snapshot_job(cfg.checkpoint.memory_every)
        for line in ignored_settings(cfg) if env.rank == 0 else ():
            print(f"[train] warning: {line}", flush=True)
        load_tokenizer(
            tokenizer_source(cfg.data.tokenizer, cfg.model.path, cfg.data.format == "chat")
        )  # what needs transformers
        job_name = os.environ.get(JOB_NAME_VAR) or unnamed_owner()
        owned = ((Path(cfg.log.dir), LOG_DIR_KEY), (cfg.checkpoint_dir, CHECKPOINT_DIR_KEY))
        for directory, key in owned:  # both checked before either is made: a refusal leaves nothing behind
            check_owner(directory, job_name, key)
        made = [d for d in (Path(cfg.log.dir), cfg.checkpoint_dir, cfg.prepared_dir) if not d.exists()]
        for directory, key in owned:
            claim(directory, job_name, key)
    except HpcError as e:
        print_error(PROG, e)
        return e.code

    import torch.distributed as dist

    from hpc.node.hang import flight_recorder_env
    from hpc.node.launcher import cuda_available
    from train.loop import Trainer
    from train.parallel import init_distributed

    if cuda_available():
        flight_recorder_env(os.environ, Path(cfg.log.dir))  # NCCL's watchdog dumps here when a collective times out
    device = init_distributed(env)
    held = group = trainer = None
    try:
        held = _take_lease(cfg.checkpoint_dir, job_name, env.rank)
        group = dist.new_group(backend="gloo")
        stop.join(group)
        trainer = Trainer(cfg, dims, env, device, held[0], slurm_job_id(os.environ))
        step = trainer.run(stop_requested=stop.agreed)
    except HpcError as e:
        if e.code != EXIT_FAILED or env.rank == 0:  # a failed save or load is the same line on every rank
            print_error(PROG, e)
        if e.code == EXIT_BAD_INPUT and group is None and env.rank == 0:  # refused the lease: unmake what this run made
            unclaim(made, job_name)
        if e.code == EXIT_BAD_INPUT and group is not None:  # bad input found by the run that holds the checkpoint
            # directory (never by one refused its lease): leave nothing this run made behind, once every rank has seen
            # the error (the others may learn of it from a file in data.prepared)
            _all_ranks_here(group)
            for directory in made if env.rank == 0 else ():
                shutil.rmtree(directory, ignore_errors=True)
            _all_ranks_here(group)  # and leave together: srun ends the others as soon as one rank has exited
        return e.code
    finally:
        stop.ignore_further()
        if held is not None and held[1] is not None:
            held[1].release()
        dist.destroy_process_group()
    if step >= cfg.steps:
        return EXIT_DONE
    if env.rank == 0:
        print(
            f"[preempt] stopped at step {step} of {cfg.steps} after {stop.received or trainer.stopped_for}, checkpoint "
            "saved",
            flush=True,
        )
    return EXIT_STOPPED


def _check_snapshot_job(every: int) -> None:
    """checkpoint.memory_every keeps its snapshots under this Slurm job's id: refused (one line) outside a job."""
    from hpc.node.snapshot_dir import job_dir
    from train.front.config import ConfigError

    if every and job_dir(os.environ) is None:
        raise ConfigError(
            f"checkpoint.memory_every={every}: needs a Slurm job (SLURM_JOB_ID): the snapshots are kept under the "
            "job's id; set checkpoint.memory_every=0"
        )


def _all_ranks_here(group) -> None:
    """Wait (bounded) until every rank reached this point, e.g. after the same error."""
    from datetime import timedelta

    import torch.distributed as dist

    try:
        dist.monitored_barrier(group, timeout=timedelta(seconds=60))
    except RuntimeError:  # a rank that failed otherwise: clean up all the same
        pass


def _take_lease(directory, job_name: str, rank: int):
    """Rank 0 takes the checkpoint directory's lease; every rank learns the run id, or raises the refusal (collective).
    Returns (run id, the lease on rank 0 else None)."""
    import torch.distributed as dist

    from hpc.node.cli import HpcError
    from hpc.node.lease import take

    lease, outcome = None, [None, None]  # [run id, refusal]
    if rank == 0:
        try:
            lease, why = take(directory, job_name, os.environ)
            lease.refresh_in_background()
            outcome[0] = lease.run_id
            if why:
                print(f"[train] took over the lease of checkpoint.dir {directory}: {why}", flush=True)
        except HpcError as e:
            outcome[1] = str(e)
    dist.broadcast_object_list(outcome, src=0)
    if outcome[1]:
        raise HpcError(outcome[1])
    return outcome[0], lease


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as e:  # sys.exit in the run: the same code, without the teardown below
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as exc:  # an error in the run: its traceback, and exit 1 (94: a suspected node fault, by
        # hpc/node/fault_table.py) without the teardown below
        traceback.print_exc()
        code = exit_code(exc)
    # Everything is written (an error's traceback too), the trackers closed and the process group destroyed. Leave
    # without the interpreter's teardown: in it torch 2.13 now and then aborts ("terminate called without an active
    # exception": a gloo worker thread letting go of its last collective cannot take the GIL), which would turn this
    # exit code (0 done, 75 stopped: requeue, 1 failed) into 134, a process killed by a signal.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
