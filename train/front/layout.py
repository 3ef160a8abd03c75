"""The parallel layout, torch-free (the login side checks it for a job's ranks): a rank's place in the job, the
validated degrees, the rules shared by the trainer and the planner, and the planner's choice as the trainer gets it.

tp divides the model's KV heads (each TP rank holds whole KV heads) and the ranks per node (a TP group stays on one
node's fast links); ep (a mixture of experts only) divides dp and the experts (each group of ep data-parallel ranks
splits the experts); cp (context parallelism, a dense model) splits every sequence over cp ranks, inside dp and
outside tp on the mesh, and FSDP shards over dp x cp together (the mesh dimension ``DP_CP``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from hpc.node.cli import shown
from hpc.node.contract import LOCAL_RANK_VAR, LOCAL_WORLD_SIZE_VAR, MASTER_ADDR_VAR, RANK_VAR, WORLD_SIZE_VAR
from train.front.batch_split import BatchSplit
from train.front.config import ConfigError, ParallelConfig, TrainConfig, with_overrides

# The device mesh's dimension names (``ParallelDims.mesh_dims``): data and tensor parallel, and with ep on the expert
# groups (ep) and the data-parallel ranks outside one (efsdp), which flatten to dp; with cp on the context-parallel
# ranks (cp) and dp x cp flattened (dp_cp), over which FSDP shards and the loss is summed (torchtitan's dp_shard_cp).
DP, TP, EP, EFSDP, CP, DP_CP = "dp", "tp", "ep", "efsdp", "cp", "dp_cp"


def tp_problem(tp: int, kv_heads: int, ranks_per_node: int) -> str | None:
    """What is wrong with ``parallel.tp=tp`` for this model and node, or None when it is allowed."""
    if kv_heads % tp:
        return (
            f"parallel.tp={tp} must divide the model's num_key_value_heads={kv_heads} (allowed: {_divisors(kv_heads)})"
        )
    if ranks_per_node % tp:
        return (
            f"parallel.tp={tp} must divide the ranks per node LOCAL_WORLD_SIZE={ranks_per_node}, so a TP group stays "
            "on one node"
        )
    return None


def tp_degrees(kv_heads: int, ranks_per_node: int) -> list[int]:
    """Every allowed tp, smallest first."""
    return [t for t in range(1, ranks_per_node + 1) if tp_problem(t, kv_heads, ranks_per_node) is None]


def ep_problem(ep: int, dp: int, num_experts: int) -> str | None:
    """What is wrong with ``parallel.ep=ep`` for this dp and model (num_experts 0: dense), or None when it is
    allowed."""
    if ep > 1 and not num_experts:
        return (
            f"parallel.ep={ep} needs a mixture-of-experts model (model.shape tiny-moe, 30B-A3B, 235B-A22B or a "
            "qwen3_moe model.path); "
            "this one is dense: use parallel.ep=1"
        )
    if dp % ep or num_experts % ep:
        return (
            f"parallel.ep={ep} must divide parallel.dp={dp} and the model's num_experts={num_experts} "
            f"(allowed: {ep_degrees(dp, num_experts)})"
        )
    return None


def ep_degrees(dp: int, num_experts: int) -> list[int]:
    """Every allowed ep, smallest first ([1] for a dense model)."""
    return [1] if not num_experts else [e for e in range(1, dp + 1) if dp % e == 0 and num_experts % e == 0]


def cp_world_problem(cp: int, num_experts: int) -> str | None:
    """What is wrong with ``parallel.cp=cp`` for this model (num_experts 0: dense), or None when it is allowed."""
    if cp > 1 and num_experts:
        return (
            f"parallel.cp={cp} needs a dense model: a mixture of experts' load-balancing loss is computed over whole "
            "sequences; use parallel.cp=1"
        )
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class WorldEnv:
    """This process's place in the job, from torchrun's variables (our Slurm launcher sets the same)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @classmethod
    def from_env(cls) -> WorldEnv:
        def get(name: str, default: int) -> int:
            value = os.environ.get(name)
            if value is None:
                return default
            if not re.fullmatch(
                r"[0-9]{1,10}", value
            ):  # int() would read "1_0" as 10, " 1" as 1, and other scripts' digits
                raise ConfigError(f"environment {name}={shown(value)}: must be a whole number (ASCII digits)")
            return int(value)

        world = get(WORLD_SIZE_VAR, 1)
        env = cls(get(RANK_VAR, 0), get(LOCAL_RANK_VAR, 0), world, get(LOCAL_WORLD_SIZE_VAR, world))
        for name, value, bound, bound_name in (
            (WORLD_SIZE_VAR, env.world_size, None, ""),
            (LOCAL_WORLD_SIZE_VAR, env.local_world_size, env.world_size, WORLD_SIZE_VAR),
            (RANK_VAR, env.rank + 1, env.world_size, WORLD_SIZE_VAR),
            (LOCAL_RANK_VAR, env.local_rank + 1, env.local_world_size, LOCAL_WORLD_SIZE_VAR),
        ):
            if value < 1 or (bound is not None and value > bound):
                given = value - 1 if name.endswith("RANK") else value
                allowed = f"0 to {bound - 1}" if name.endswith("RANK") else (f"1 to {bound}" if bound else "at least 1")
                raise ConfigError(
                    f"environment {name}={given}: allowed {allowed}" + (f" ({bound_name}={bound})" if bound else "")
                )
        if env.world_size > 1 and not os.environ.get(MASTER_ADDR_VAR):
            raise ConfigError(
                f"environment {WORLD_SIZE_VAR}={env.world_size} but {MASTER_ADDR_VAR} is not set: start the ranks with "
                "torchrun or hpc.node.launch"
            )
        return env


@dataclass(frozen=True)
class ParallelDims:
    """Validated parallel degrees: dp * cp * tp == world_size, tp, ep and cp by the rules above."""

    dp: int
    tp: int
    ep: int = 1
    cp: int = 1

    @classmethod
    def build(cls, cfg: ParallelConfig, env: WorldEnv, kv_heads: int, num_experts: int = 0) -> ParallelDims:
        tp, cp = cfg.tp, cfg.cp
        problem = tp_problem(tp, kv_heads, env.local_world_size) or cp_world_problem(cp, num_experts)
        if problem:
            raise ConfigError(problem)
        if cp > 1 and cfg.dp is None and env.world_size % (cp * tp):
            raise ConfigError(
                f"parallel.cp={cp} x parallel.tp={tp} = {cp * tp} must divide WORLD_SIZE={env.world_size}"
            )
        dp = cfg.dp if cfg.dp is not None else env.world_size // (cp * tp)
        if dp * cp * tp != env.world_size:
            cp_part = f" x parallel.cp={cp}" if cp > 1 else ""
            raise ConfigError(
                f"parallel.dp={dp}{cp_part} x parallel.tp={tp} = {dp * cp * tp} must equal WORLD_SIZE={env.world_size} "
                f"(omit parallel.dp to use WORLD_SIZE // {'(cp x tp)' if cp > 1 else 'tp'})"
            )
        problem = ep_problem(cfg.ep, dp, num_experts)
        if problem:
            raise ConfigError(problem)
        return cls(dp, tp, cfg.ep, cp)

    @property
    def ep_enabled(self) -> bool:
        """Expert parallelism on: each group of ep data-parallel ranks splits the experts."""
        return self.ep > 1

    @property
    def cp_enabled(self) -> bool:
        """Context parallelism on: each group of cp ranks splits every sequence."""
        return self.cp > 1

    def mesh_dims(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The device mesh's shape and dimension names: (dp, tp); with ep on (dp // ep, ep, tp), whose efsdp and ep
        flatten to dp (an EP group is ep consecutive dp ranks); with cp on (dp, cp, tp), whose dp and cp flatten to
        dp_cp (``flattened``)."""
        if self.ep_enabled:
            return (self.dp // self.ep, self.ep, self.tp), (EFSDP, EP, TP)
        if self.cp_enabled:
            return (self.dp, self.cp, self.tp), (DP, CP, TP)
        return (self.dp, self.tp), (DP, TP)

    def flattened(self) -> tuple[str, tuple[str, ...]] | None:
        """The mesh dimension made by flattening others, and those: (dp, (efsdp, ep)) with ep on, (dp_cp, (dp, cp))
        with cp on, else None."""
        if self.ep_enabled:
            return DP, (EFSDP, EP)
        if self.cp_enabled:
            return DP_CP, (DP, CP)
        return None

    def batch_split(self, global_batch: int, micro_batch: int) -> BatchSplit:
        """How each step's global batch splits over dp (any dp: the global batch stays what the config says)."""
        return BatchSplit(global_batch, micro_batch, self.dp)


@dataclass(frozen=True)
class Layout:
    """The planner's choice for the trainer: parallel.tp, parallel.ep, activation checkpointing turned on, activation
    offload (one GPU) turned on, and parallel.cp. The trainer gets it as ``overrides()``; ``apply`` is those overrides
    applied to a loaded config."""

    tp: int
    ep: int = 1
    activation_checkpointing: bool = False
    activation_offload: bool = False
    cp: int = 1

    def overrides(self) -> list[str]:
        """As trainer overrides (key.sub=value)."""
        return (
            [f"parallel.tp={self.tp}"]
            + ([f"parallel.ep={self.ep}"] if self.ep > 1 else [])
            + ([f"parallel.cp={self.cp}"] if self.cp > 1 else [])
            + (["activation_checkpointing=true"] if self.activation_checkpointing else [])
            + (["activation_offload=true"] if self.activation_offload else [])
        )

    def apply(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with ``overrides()`` added, as the trainer loads it with them."""
        return with_overrides(cfg, self.overrides())
