"""How a job's ranks start: srun (a task per GPU), torchrun and accelerate (a task per node that starts
the node's ranks); each launcher's tasks per node, the Slurm values it needs and its command lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from hpc.node.cli import HpcError
from hpc.node.contract import LAUNCH_MODULE
from hpc.node.rank_info import RankInfo


def cuda_available() -> bool:
    """Whether this node has a usable CUDA device."""
    import torch

    return torch.cuda.is_available()


def local_cuda_index(local_rank: int, visible: int) -> int:
    """The CUDA device of the node's rank ``local_rank`` among the ``visible`` ones: its own index, or where Slurm bound
    each task to its GPUs (a partition's gpu_bind, e.g. map_gpu:0,1,2,3: one visible device per rank) its index among
    those."""
    return local_rank % visible


@dataclass(frozen=True)
class Launcher:
    name: str
    per_node: bool  # one task per node, which starts the node's ranks itself
    needs: tuple[str, ...]  # the properties of hpc.node.slurm_env.SLURM_VARS it reads on the node
    help: str

    def tasks_per_node(self, gpus_per_node: int) -> int:
        return 1 if self.per_node else gpus_per_node

    def task_argv(
        self, python: str, gpus_per_node: int, command: Sequence[str], container: Optional[str] = None
    ) -> list[str]:
        """What srun starts on every task: the node-side launch (with the container runtime's command, as shell
        words, that it runs the rank command behind), then the rank command."""
        gpus = ["--gpus-per-node", str(gpus_per_node)] if self.per_node else []
        wrap = ["--container", container] if container else []
        return [python, "-u", "-m", LAUNCH_MODULE, "--launcher", self.name, *gpus, *wrap, "--", *command]

    def rank_env(self, info: RankInfo) -> dict[str, str]:
        """Variables this task sets for its rank program (a per-node launcher sets them for its processes itself)."""
        return {} if self.per_node else info.torch_env()

    def node_argv(self, command: Sequence[str], info: RankInfo, cuda: Optional[bool] = None) -> list[str]:
        """The argv this task runs: the rank command itself (srun). ``cuda`` None: probe the node when it matters."""
        return list(command)


def _as_rank(command: Sequence[str]) -> list[str]:
    """A per-node launcher's process runs the rank command through ``hpc.node.launch --rank`` (their --no-python
    form), so each rank's clean stop is handled as under srun."""
    return [command[0], "-u", "-m", LAUNCH_MODULE, "--rank", "--", *command]


class Torchrun(Launcher):
    def node_argv(self, command: Sequence[str], info: RankInfo, cuda: Optional[bool] = None) -> list[str]:
        return [
            command[0],
            "-u",
            "-m",
            "torch.distributed.run",
            f"--nnodes={info.num_nodes}",
            f"--nproc-per-node={info.local_world_size}",
            f"--node-rank={info.node_rank}",
            f"--master-addr={info.master_addr}",
            f"--master-port={info.master_port}",
            "--no-python",
            *_as_rank(command),
        ]


class Accelerate(Launcher):
    def node_argv(self, command: Sequence[str], info: RankInfo, cuda: Optional[bool] = None) -> list[str]:
        """``--multi_gpu`` whenever the job has more than one rank; without CUDA on the node
        ACCELERATE_USE_CPU=true makes every process join over gloo (MULTI_CPU)."""
        multi = ["--multi_gpu"] if info.world_size > 1 else []
        cpu = [] if (cuda_available() if cuda is None else cuda) else ["env", "ACCELERATE_USE_CPU=true"]
        return [
            *cpu,
            command[0],
            "-u",
            "-m",
            "accelerate.commands.launch",
            *multi,
            f"--num_machines={info.num_nodes}",
            f"--num_processes={info.world_size}",
            f"--machine_rank={info.node_rank}",
            f"--main_process_ip={info.master_addr}",
            f"--main_process_port={info.master_port}",
            "--no_python",
            *_as_rank(command),
        ]


_PER_NODE_NEEDS = ("job_id", "num_tasks", "node_rank", "num_nodes", "nodelist")
SRUN = Launcher(
    "srun",
    False,
    ("job_id", "global_rank", "num_tasks", "local_rank", "node_rank", "num_nodes", "nodelist", "tasks_per_node"),
    "one task per GPU",
)
LAUNCHERS: dict[str, Launcher] = {
    launcher.name: launcher
    for launcher in (
        SRUN,
        Torchrun("torchrun", True, _PER_NODE_NEEDS, "one task per node running torchrun"),
        Accelerate("accelerate", True, _PER_NODE_NEEDS, "one task per node running accelerate launch"),
    )
}


def get_launcher(name: str, flag: str = "--launcher") -> Launcher:
    """The launcher of that name; an HpcError naming ``flag`` and the allowed names otherwise."""
    if name not in LAUNCHERS:
        raise HpcError(f"{flag} {name}: allowed: {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]
