"""Distributed checkpoints: DCP save/load that reshards across dp x tp layouts, atomic commit, retention.

Layout under the checkpoint root::

    step-00000100/            complete: renamed from .tmp only after every rank finished
      .metadata, __*.distcp   model + optimizer (torch.distributed.checkpoint, sharded)
      rng-rank*.pt            each rank's RNG states
      meta.json               the COMPLETE marker: step, layout, data stream state
    step-00000200.tmp/        incomplete (crashed while saving): ignored, removed by the next save

A save is started (``start_save``: the state is copied to host memory, then written, in the
background with a stager) and committed (``commit``: every rank waits for its writes, rank 0
writes meta.json and renames); ``save`` does both at once.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import AsyncStager, BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

_NAME = re.compile(r"^step-(\d{8})$")
META = "meta.json"


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _NAME.match(d.name)
        if m and (d / META).is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints; returns what was deleted."""
    old = [path for _, path in complete_checkpoints(root)[:-keep_last]]
    for path in old:
        shutil.rmtree(path)
    return old


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@dataclass
class PendingSave:
    """A checkpoint being written: ``future`` resolves once this rank's files are on disk."""

    future: Future
    step: int
    tmp: Path
    final: Path
    meta: dict
    keep_last: int
    background: bool
    blocked_s: float  # how long start_save blocked: the copy to host memory, or the whole write when not in the background


def host_stager(pinned: bool) -> AsyncStager:
    """Copies the state to host memory so training can go on while it is written; ``pinned`` (GPU): into pinned
    buffers allocated at the first save and reused by the next ones."""
    return BlockingAsyncStager(cache_staged_state_dict=pinned)


def start_save(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict, keep_last: int,
               stager: AsyncStager | None = None, write_group: dist.ProcessGroup | None = None) -> PendingSave:
    """Begin a checkpoint of ``step`` (collective). With ``stager`` the state is copied to host memory and written
    by a background thread that talks over ``write_group`` (a gloo group of its own); without, it is written now."""
    rank = dist.get_rank()
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        for stale in Path(root).glob("step-*.tmp"):  # left by a save that crashed
            shutil.rmtree(stale)
        tmp.mkdir(parents=True)
    dist.barrier()
    t0 = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    torch.save(_rng_state(), tmp / f"rng-rank{rank}.pt")
    state = {"model": model_sd, "optim": optim_sd}
    if stager is None:
        dcp.save(state, checkpoint_id=tmp)
        future: Future = Future()
        future.set_result(None)
    else:
        future = dcp.async_save(state, checkpoint_id=tmp, process_group=write_group, async_stager=stager)
    return PendingSave(future, step, tmp, final, meta, keep_last, stager is not None, time.perf_counter() - t0)


def commit(pending: PendingSave) -> Path:
    """Wait until every rank wrote its part of ``pending``, then make it the newest complete checkpoint (collective)."""
    pending.future.result()
    dist.barrier()
    if dist.get_rank() == 0:
        meta = {"step": pending.step, "world_size": dist.get_world_size(), "saved_at": time.time(), **pending.meta}
        (pending.tmp / META).write_text(json.dumps(meta, indent=2))
        shutil.rmtree(pending.final, ignore_errors=True)
        os.replace(pending.tmp, pending.final)
        prune(pending.final.parent, pending.keep_last)
    dist.barrier()
    return pending.final


def save(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict, keep_last: int) -> Path:
    """Save a checkpoint of ``step`` now (collective). ``meta`` (JSON) is written last, as the COMPLETE marker."""
    return commit(start_save(root, step, model, optimizer, meta, keep_last))


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load model and optimizer into the current layout (collective); restores RNG states if the world size matches. Returns meta."""
    path = Path(path)
    meta = json.loads((path / META).read_text())
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if meta["world_size"] == dist.get_world_size():
        _set_rng_state(torch.load(path / f"rng-rank{dist.get_rank()}.pt", weights_only=False))
    return meta
