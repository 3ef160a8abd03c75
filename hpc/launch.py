"""First thing on every Slurm task: derive the rank wiring, then run the rank command.

    srun python -m hpc.launch [--launcher srun|torchrun|accelerate] [--gpus-per-node G] -- CMD ARGS...

With ``srun`` (one task per GPU) the task becomes rank RANK and execs CMD with
RANK, WORLD_SIZE, LOCAL_RANK, ... set.  With ``torchrun`` or ``accelerate``
(one task per node) it execs ``torchrun`` / ``accelerate launch`` with this
node's rank, read here on the node itself.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from hpc.netcheck import DEFAULT_DIST_TIMEOUT_S, DIST_TIMEOUT_VAR, NodeCheckError, check_node, dist_timeout_s
from hpc.requeue import REQUEUE_EXIT, ignore_prestop
from hpc.slurm_env import LAUNCHERS, RankError, RankInfo, derive

REQUEUE_GRACE_S = 120


def cuda_available() -> bool:
    """Whether this node has a usable CUDA device."""
    import torch

    return torch.cuda.is_available()


def node_argv(launcher: str, command: Sequence[str], info: RankInfo, cuda: Optional[bool] = None) -> list[str]:
    """The argv this task runs: the rank command itself, or torchrun / accelerate launch around it.

    `accelerate` runs its multi-process launcher (``--multi_gpu``) whenever the
    job has more than one rank; without CUDA on the node (``cuda`` None: probe
    it) ACCELERATE_USE_CPU=true makes every process join over gloo (MULTI_CPU).
    """
    if launcher == "srun":
        return list(command)
    python, rest = command[0], [a for a in command[1:] if a != "-u"]
    if launcher == "torchrun":
        return [
            python, "-u", "-m", "torch.distributed.run",
            f"--nnodes={info.num_nodes}", f"--nproc-per-node={info.local_world_size}",
            f"--node-rank={info.node_rank}", f"--master-addr={info.master_addr}",
            f"--master-port={info.master_port}", *rest,
        ]
    multi = ["--multi_gpu"] if info.world_size > 1 else []
    cpu = [] if (cuda_available() if cuda is None else cuda) else ["env", "ACCELERATE_USE_CPU=true"]
    return [
        *cpu, python, "-u", "-m", "accelerate.commands.launch", *multi,
        f"--num_machines={info.num_nodes}", f"--num_processes={info.world_size}",
        f"--machine_rank={info.node_rank}", f"--main_process_ip={info.master_addr}",
        f"--main_process_port={info.master_port}", *rest,
    ]


def prepare(launcher: str, command: Sequence[str], gpus_per_node: Optional[int],
            environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and environment for this task; raises RankError or NodeCheckError with what to change."""
    info = derive(environ, launcher, gpus_per_node)
    env = dict(environ)
    if launcher == "srun":
        env.update(info.torch_env())
    env.setdefault(DIST_TIMEOUT_VAR, str(DEFAULT_DIST_TIMEOUT_S))
    dist_timeout_s(env)
    net = check_node(env)
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    print(
        f"[launch] {node} job {info.job_id} restart {info.restart_count}: "
        + (f"rank {info.rank}/{info.world_size} local {info.local_rank}/{info.local_world_size} "
           if launcher == "srun" else f"{launcher} x{info.local_world_size} ")
        + f"node {info.node_rank}/{info.num_nodes} master {info.master_addr}:{info.master_port}",
        flush=True,
    )
    if info.local_rank == 0:
        print(f"[netcheck] {node}: {net}; {DIST_TIMEOUT_VAR}={env[DIST_TIMEOUT_VAR]}", flush=True)
    return node_argv(launcher, command, info), env


@dataclass(frozen=True)
class LaunchTask:
    """The callable submitit runs on every task: the same wiring as `python -m hpc.launch`."""

    launcher: str
    command: tuple[str, ...]
    gpus_per_node: Optional[int] = None

    def __call__(self) -> int:
        argv, env = prepare(self.launcher, self.command, self.gpus_per_node, os.environ)
        # Slurm signals every process of the step; the rank command handles the stop itself
        # (save together, requeue), so submitit's own handler must not requeue or exit first.
        ignore_prestop(os.environ)
        rc = subprocess.call(argv, env=env)
        if rc == REQUEUE_EXIT:
            print("[launch] ranks stopped for requeue; waiting for Slurm to end this run", flush=True)
            time.sleep(REQUEUE_GRACE_S)
            raise RuntimeError(f"the job was not requeued within {REQUEUE_GRACE_S} s after its ranks stopped")
        if rc != 0:
            raise RuntimeError(f"rank command exited with status {rc}: {' '.join(argv)}")
        return rc


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m hpc.launch", description=__doc__.split("\n")[0])
    p.add_argument("--launcher", default="srun", choices=LAUNCHERS)
    p.add_argument("--gpus-per-node", type=int, default=None)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command given after --")
    try:
        run_argv, env = prepare(a.launcher, command, a.gpus_per_node, os.environ)
    except (RankError, NodeCheckError) as e:
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        print(f"hpc.launch: error on {node}: {e}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.flush()
    ignore_prestop(os.environ)
    os.execvpe(run_argv[0], run_argv, env)


if __name__ == "__main__":
    main()
