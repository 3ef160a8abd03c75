"""Who is missing at a hang, and the bad-node marks the batch script requeues around.

When a collective times out, every rank still running is blocked in it and times out within seconds of the others.
Each posts its arrival to the rendezvous store (torch.distributed's default store, with a short timeout of its own),
waits a short grace for the others (less once every rank posted) and the lowest rank that arrived names those that
did not, with their nodes (gathered once at setup, `gather_nodes`):

    [hang] a collective timed out after step 42 (after 20 s): rank 3 on n2 did not arrive (ranks 0-2 did)

After a timeout it also marks their nodes bad (``HPC_BAD_NODE_MARKS``, set by the batch script): the script then
requeues the job without them. A collective that failed because a peer's process ended (its host closed the
connections: the node answered, the program failed) names the missing ranks the same way but marks no node. On GPU
NCCL's own watchdog ends the process at the timeout; its flight recorder dumps every rank's last collectives into
the run's log directory instead (`flight_recorder_env`).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Mapping, MutableMapping

from hpc.node.attempt import record_collective
from hpc.node.contract import BAD_NODE_MARKS_VAR, FLIGHT_RECORDER_DIR, MASTER_ADDR_VAR, MASTER_PORT_VAR
from hpc.node.slurm_env import node_name

ARRIVED_KEY = "hpc-hang-arrived-{rank}"
STORE_TIMEOUT_S = 5.0  # the store answers within this or is taken to be gone
GRACE_S = 5.0  # how long the arrived wait for the others to time out too (they do within a second or two)
FLIGHT_RECORDER_ENTRIES = 2000  # collectives per rank NCCL's flight recorder keeps


def gather_nodes(group=None) -> list[str]:
    """Every rank's node name, by rank (collective over ``group``, a gloo group)."""
    import torch.distributed as dist

    nodes: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(nodes, node_name(), group=group)
    return nodes


PEER_ENDED = ("connection closed", "connection reset", "broken pipe")  # gloo's words when a peer's process ended


def collective_failure(error: BaseException) -> str | None:
    """Why a collective failed: "timeout" (a peer did not take part in time: stopped, hung, or gone with its node),
    "peer ended" (a peer's process ended and its host closed the connections: the node itself answered), or None
    for any other error."""
    import torch.distributed as dist

    text = str(error).lower()
    if any(w in text for w in PEER_ENDED):
        return "peer ended"
    if isinstance(error, dist.DistError) or "timed out" in text or "timeout" in text:
        return "timeout"
    return None


def post_arrival(
    store,
    rank: int,
    world: int,
    failure: str = "timeout",
    grace_s: float = GRACE_S,
    store_timeout_s: float = STORE_TIMEOUT_S,
) -> dict[int, str] | None:
    """Post this rank's arrival with how its collective failed (`collective_failure`) and return each rank that
    arrived within ``grace_s`` (sooner once all did) with its failure; None when the store does not answer. A
    TCPStore whose host is stopped may block a read for ever, whatever its timeout: the talk runs in a thread of its
    own, given up after the grace and the store's timeout."""
    found: list[dict[int, str]] = []

    def talk() -> None:
        try:
            store.set_timeout(timedelta(seconds=store_timeout_s))
            store.set(ARRIVED_KEY.format(rank=rank), failure)
            deadline = time.monotonic() + grace_s
            while True:
                arrived = [r for r in range(world) if store.check([ARRIVED_KEY.format(rank=r)])]
                if len(arrived) == world or time.monotonic() >= deadline:
                    found.append({r: store.get(ARRIVED_KEY.format(rank=r)).decode() for r in arrived})
                    return
                time.sleep(0.2)
        except Exception:  # the store's errors are RuntimeErrors of several kinds; any of them: it does not answer
            return

    thread = threading.Thread(target=talk, name="hpc-hang-arrival", daemon=True)
    thread.start()
    thread.join(grace_s + store_timeout_s)
    return found[0] if found else None


def ranks_text(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2, 5-7'."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def missing_text(missing: list[int], nodes: list[str]) -> str:
    """'rank 3 on n2', 'ranks 4-7 on n2', 'rank 1 on n1, rank 5 on n2' (grouped by node)."""
    by_node: dict[str, list[int]] = {}
    for r in missing:
        by_node.setdefault(nodes[r], []).append(r)
    return ", ".join(f"{ranks_text(rs)} on {node}" for node, rs in by_node.items())


def hang_line(
    where: str,
    elapsed_s: float,
    arrived: list[int] | None,
    nodes: list[str],
    environ: Mapping[str, str] = os.environ,
    peer_ended: bool = False,
) -> str:
    """The one line that says who did not arrive (``arrived`` None: the store did not answer; ``peer_ended``: the
    collective failed because a peer's process ended, not on a timeout)."""
    head = (
        f"[hang] a collective failed {where}, a peer's process having ended"
        if peer_ended
        else f"[hang] a collective timed out {where}"
    ) + f" (after {elapsed_s:.0f} s)"
    if arrived is None:
        store = f"{environ.get(MASTER_ADDR_VAR, '?')}:{environ.get(MASTER_PORT_VAR, '?')}"
        return (
            f"{head}: the rendezvous store at {store} did not answer either; its host (rank 0's process on "
            f"{nodes[0]}, or torchrun's agent there) may be the one stopped"
        )
    missing = [r for r in range(len(nodes)) if r not in arrived]
    if not missing:
        return (
            f"{head}: every rank arrived at the timeout (a collective of a subgroup, or ranks in different collectives)"
        )
    return f"{head}: {missing_text(missing, nodes)} did not arrive ({ranks_text(arrived)} did)"


def name_the_missing(
    where: str,
    elapsed_s: float,
    rank: int,
    nodes: list[str],
    failure: str,
    store=None,
    grace_s: float = GRACE_S,
    step: int | None = None,
) -> tuple[list[int] | None, list[int], bool]:
    """After a collective failed with ``failure`` (`collective_failure`): post this rank's arrival; the lowest rank
    that arrived (each rank, when the store does not answer) prints the hang line and, after a timeout, marks the
    missing ranks' nodes bad. It was a timeout when any rank that arrived timed out: the first rank to give up on a
    stopped peer tears its connections down, and ranks waiting on it then see "connection closed" instead. Returns
    the ranks that arrived (None: the store did not answer), the missing ones, and whether a peer's process ended.
    ``store``: torch.distributed's default store unless given; ``step``: the last step every rank finished, for the
    record a job with spare nodes keeps of the failure (`hpc.node.attempt`)."""
    import torch.distributed as dist

    failed_at = time.time()
    world = len(nodes)
    store = store if store is not None else dist.distributed_c10d._get_default_store()
    found = post_arrival(store, rank, world, failure, grace_s=grace_s)
    arrived = sorted(found) if found is not None else None
    missing = [r for r in range(world) if arrived is not None and r not in arrived]
    peer_ended = all(f == "peer ended" for f in (found.values() if found is not None else [failure]))
    if arrived is None or rank == arrived[0]:
        print(hang_line(where, elapsed_s, arrived, nodes, peer_ended=peer_ended), flush=True)
        bad = sorted({nodes[r] for r in missing})
        if bad and not peer_ended:  # a process that ended (a crash) says nothing of its node
            marked = mark_bad_nodes(bad)
            if marked:
                print(f"[hang] marked {', '.join(bad)} bad in {marked}", flush=True)
    record_collective(rank, nodes[rank], failure, step, failed_at, elapsed_s, arrived, missing, nodes)
    return arrived, missing, peer_ended


def mark_bad_nodes(nodes: list[str], environ: Mapping[str, str] = os.environ) -> Path | None:
    """One empty file per node in the directory ``HPC_BAD_NODE_MARKS`` names (the batch script's marks: it requeues
    the job without them); None outside such a job."""
    marks = environ.get(BAD_NODE_MARKS_VAR)
    if not marks:
        return None
    path = Path(marks)
    path.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        (path / node).touch()
    return path


def flight_recorder_env(environ: MutableMapping[str, str], log_dir: Path) -> Path | None:
    """For an NCCL run: NCCL's flight recorder on, dumping each rank's last collectives into
    ``log_dir/nccl-trace/rank-<R>`` when a collective times out (each variable only where unset)."""
    if "TORCH_FR_DUMP_TEMP_FILE" in environ and "TORCH_NCCL_DUMP_ON_TIMEOUT" in environ:
        return None
    directory = Path(log_dir) / FLIGHT_RECORDER_DIR
    directory.mkdir(parents=True, exist_ok=True)
    environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", str(FLIGHT_RECORDER_ENTRIES))
    environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(directory / "rank-"))
    return directory
