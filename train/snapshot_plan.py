"""The pure part of the memory snapshots (``train.snapshot``): which rank keeps whose partner copy, and which
snapshot an in-job restart resumes from (where they live: `hpc.node.snapshot_dir`). No torch, no files.

Every ``checkpoint.memory_every`` steps each rank's state goes to its node's memory (tmpfs) and to its partner: the rank
of the same local index on the next node, ``(node + 1) % nodes``. A node lost with its memory leaves each of its ranks'
states on the next node.
"""

from __future__ import annotations

from dataclasses import dataclass


def partners(nodes: list[str]) -> list[int]:
    """Each rank's partner rank (``nodes``: each rank's node name, by rank): the same local index on the next node, in
    the order the nodes first appear. ValueError when the nodes run different numbers of ranks or there is one node."""
    order = list(dict.fromkeys(nodes))
    ranks = {node: [r for r, n in enumerate(nodes) if n == node] for node in order}
    counts = {len(rs) for rs in ranks.values()}
    if len(order) < 2 or len(counts) != 1:
        raise ValueError(f"snapshots need 2 or more nodes with the same number of ranks each: {dict(ranks)}")
    out = [0] * len(nodes)
    for i, node in enumerate(order):
        following = ranks[order[(i + 1) % len(order)]]
        for local, rank in enumerate(ranks[node]):
            out[rank] = following[local]
    return out


def sender_of(partner: list[int], rank: int) -> int:
    """The rank whose partner copy ``rank`` keeps."""
    return partner.index(rank)


@dataclass(frozen=True)
class Found:
    """What one rank sees in its node's snapshot directory: for each step, the ranks whose state file is there, and
    the steps that hold a completion marker (written only after every rank's own and partner copy was written)."""

    node: str
    files: dict[int, list[int]]
    complete: list[int]


@dataclass(frozen=True)
class Choice:
    """The snapshot to resume from: its step, and for each rank the rank whose node holds its state (itself or a rank
    on its node: read there; another node's: sent from there)."""

    step: int
    source: list[int]

    def transfers(self, nodes: list[str]) -> list[tuple[int, int]]:
        """(from, to) for each rank whose state is not on its own node, in rank order."""
        return [(src, r) for r, src in enumerate(self.source) if nodes[src] != nodes[r]]


def choose(found: list[Found], disk_step: int | None) -> Choice | None:
    """The newest snapshot complete for every rank (a marker of it anywhere, every rank's state on some node), when it
    is newer than the newest disk checkpoint (``disk_step``); None: resume from the disk as without snapshots. A rank's
    own node is preferred as the source, then the lowest rank holding it."""
    world = len(found)
    marked = {s for f in found for s in f.complete}
    for step in sorted(marked, reverse=True):
        if disk_step is not None and step <= disk_step:
            return None
        source = []
        for rank in range(world):
            holders = [r for r, f in enumerate(found) if rank in f.files.get(step, [])]
            local = [r for r in holders if found[r].node == found[rank].node]
            if not holders:
                break
            source.append((local or holders)[0])
        if len(source) == world:
            return Choice(step, source)
    return None
