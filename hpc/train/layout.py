"""The tensor-parallel rule, shared by the trainer and the planner: tp divides the model's KV heads (each TP
rank holds whole KV heads) and the ranks per node (a TP group stays on one node's fast links)."""
from __future__ import annotations


def tp_problem(tp: int, kv_heads: int, ranks_per_node: int) -> str | None:
    """What is wrong with ``parallel.tp=tp`` for this model and node, or None when it is allowed."""
    if kv_heads % tp:
        return f"parallel.tp={tp} must divide the model's num_key_value_heads={kv_heads} (allowed: {_divisors(kv_heads)})"
    if ranks_per_node % tp:
        return f"parallel.tp={tp} must divide the ranks per node LOCAL_WORLD_SIZE={ranks_per_node}, so a TP group stays on one node"
    return None


def tp_degrees(kv_heads: int, ranks_per_node: int) -> list[int]:
    """Every allowed tp, smallest first."""
    return [t for t in range(1, ranks_per_node + 1) if tp_problem(t, kv_heads, ranks_per_node) is None]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
