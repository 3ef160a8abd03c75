"""A rank's place in the job (rank, world, node, rendezvous address), as derived from Slurm's variables by
``hpc.node.slurm_env`` and handed to a launcher (``hpc.node.launcher``)."""

from __future__ import annotations

from dataclasses import dataclass

from hpc.node.contract import (
    GROUP_RANK_VAR,
    LOCAL_RANK_VAR,
    LOCAL_WORLD_SIZE_VAR,
    MASTER_ADDR_VAR,
    MASTER_PORT_VAR,
    NODE_RANK_VAR,
    RANK_VAR,
    WORLD_SIZE_VAR,
)


@dataclass(frozen=True)
class RankInfo:
    job_id: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    restart_count: int

    def torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads."""
        return {
            RANK_VAR: str(self.rank),
            WORLD_SIZE_VAR: str(self.world_size),
            LOCAL_RANK_VAR: str(self.local_rank),
            LOCAL_WORLD_SIZE_VAR: str(self.local_world_size),
            NODE_RANK_VAR: str(self.node_rank),
            GROUP_RANK_VAR: str(self.node_rank),
            MASTER_ADDR_VAR: self.master_addr,
            MASTER_PORT_VAR: str(self.master_port),
        }
