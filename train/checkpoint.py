"""Distributed checkpoints: DCP save/load that reshards across dp x tp layouts, atomic commit, retention.

Layout under the checkpoint root::

    step-00000100/            complete: renamed from .tmp only after every rank finished
      .metadata, __*.distcp   trainable weights + optimizer (torch.distributed.checkpoint, sharded)
      rng-rank*.pt            each rank's RNG states
      meta.json               the COMPLETE marker: step, layout, data stream state, and the
                              manifest (every file's size); written last
    step-00000200.tmp/        incomplete (crashed while saving): ignored, removed by the next save
    step-00000150.bad-.../    failed to load: set aside, never loaded again

A checkpoint counts as complete only when meta.json is there and every file its manifest
lists is there with its size. Files, meta.json and the directories are fsynced before and
after the rename. A save is started (``start_save``: the state is copied to host memory,
then written, in the background with a stager) and committed (``commit``: every rank waits
for its writes, rank 0 writes meta.json and renames); ``save`` does both at once. Whatever
goes wrong in a save is a `CheckpointError` on every rank, and the previous checkpoints stay.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
from torch.distributed.checkpoint.staging import AsyncStager, BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hpc.node.cli import HpcError
from hpc.node.contract import CHECKPOINT_META as META
from hpc.node.contract import CHECKPOINT_PREFIX, EXIT_FAILED, checkpoint_name, checkpoint_step


# Only trainable parameters are saved: all of them in a full fine-tune, the adapters of a LoRA run (whose frozen
# base comes from model.path or the seed at every start).
# DCP's load fails on any of them missing from the files; setting them leaves the frozen ones (not strict) alone.
_TRAINABLE = StateDictOptions(ignore_frozen_params=True)
_SET_TRAINABLE = StateDictOptions(ignore_frozen_params=True, strict=False)


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / checkpoint_name(step)


class CheckpointError(HpcError):
    """A save or load that failed (the run failed: exit 1); the message is one line."""

    code = EXIT_FAILED


def is_complete(path: Path) -> bool:
    """meta.json is there and every file of its manifest is there with its size."""
    try:
        files = json.loads((path / META).read_text())["files"]
        return all((path / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        step = checkpoint_step(d.name)
        if step is not None and is_complete(d):
            found.append((step, d))
    return sorted(found)


def set_aside(path: Path, reason: str) -> Path:
    """Rename a checkpoint that failed to load so that it is never loaded again; returns the new path."""
    target = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, target)
    (target / "WHY.txt").write_text(reason + "\n")
    return target


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _one_line(e: BaseException) -> str:
    """The cause in one line: for DCP's CheckpointException, each failing rank's own exception, without tracebacks."""
    if isinstance(e, CheckpointException):
        return "; ".join(f"rank {rank}: {_one_line(exc)}" for rank, (exc, _) in sorted(e.failures.items()))
    text = " ".join(str(e).split())[:400]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


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
    error = None
    if rank == 0:
        try:
            for stale in Path(root).glob(f"{CHECKPOINT_PREFIX}*.tmp"):  # left by a save of this run that crashed
                shutil.rmtree(stale)
            tmp.mkdir(parents=True)
        except OSError as e:
            error = f"cannot create {tmp} ({e.strerror})"
    _agree(error, f"checkpoint of step {step}", root)
    t0 = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_TRAINABLE)
    error = None
    try:
        rng = tmp / f"rng-rank{rank}.pt"
        torch.save(_rng_state(), rng)
        _fsync(rng)
    except (OSError, RuntimeError) as e:
        error = f"rank {rank}: {_one_line(e)}"
    _agree(error, f"checkpoint of step {step}", root)
    state = {"model": model_sd, "optim": optim_sd}
    try:
        if stager is None:
            dcp.save(state, checkpoint_id=tmp)  # its writer fsyncs every file it writes
            future: Future = Future()
            future.set_result(None)
        else:
            future = dcp.async_save(state, checkpoint_id=tmp, process_group=write_group, async_stager=stager)
    except (Exception, CheckpointException) as e:  # DCP raises the same CheckpointException on every rank
        raise CheckpointError(f"checkpoint of step {step} in {tmp} failed: {_one_line(e)}{_free_space(root)}; "
                              "the previous checkpoints are kept") from None
    return PendingSave(future, step, tmp, final, meta, keep_last, stager is not None, time.perf_counter() - t0)


def _agree(error: str | None, what: str, root: Path, saving: bool = True) -> None:
    """Raise CheckpointError on every rank when any rank had ``error`` (collective)."""
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        kept = "; the previous checkpoints are kept" if saving else ""
        raise CheckpointError(f"{what} failed: {first}{_free_space(root)}{kept}")


def _free_space(root: Path) -> str:
    """How much room is left where checkpoints go (a full disk often fails deep inside a writer, unnamed)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return ""
    return f" ({st.f_bavail * st.f_frsize / 2**20:.1f} MiB free in {root})"


def commit(pending: PendingSave) -> Path:
    """Wait until every rank wrote its part of ``pending``, then make it the newest complete checkpoint (collective)."""
    error = None
    try:
        pending.future.result()
    except (Exception, CheckpointException) as e:
        error = _one_line(e)
    _agree(error, f"checkpoint of step {pending.step} in {pending.tmp}", pending.final.parent)
    if dist.get_rank() == 0:
        try:
            files = {p.name: p.stat().st_size for p in sorted(pending.tmp.iterdir()) if p.is_file()}
            meta = {"step": pending.step, "world_size": dist.get_world_size(), "saved_at": time.time(), **pending.meta,
                    "files": files}
            (pending.tmp / META).write_text(json.dumps(meta, indent=2))
            _fsync(pending.tmp / META)
            _fsync(pending.tmp)
            shutil.rmtree(pending.final, ignore_errors=True)
            os.replace(pending.tmp, pending.final)
            _fsync(pending.final.parent)
            prune(pending.final.parent, pending.keep_last)
        except OSError as e:
            error = f"{e.strerror} ({e.filename})"
    _agree(error, f"commit of checkpoint step {pending.step}", pending.final.parent)
    return pending.final


def save(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict, keep_last: int) -> Path:
    """Save a checkpoint of ``step`` now (collective). ``meta`` (JSON) is written last, as the COMPLETE marker."""
    return commit(start_save(root, step, model, optimizer, meta, keep_last))


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load model and optimizer into the current layout (collective); restores RNG states if the world size matches.
    Returns meta; a checkpoint that fails to load on any rank is a CheckpointError on every rank."""
    path = Path(path)
    error, meta = None, {}
    try:
        meta = json.loads((path / META).read_text())
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_TRAINABLE)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=_SET_TRAINABLE)
        if meta["world_size"] == dist.get_world_size():
            _set_rng_state(torch.load(path / f"rng-rank{dist.get_rank()}.pt", weights_only=False))
    except (Exception, CheckpointException) as e:  # a corrupt file fails in many ways; each is reported, the checkpoint set aside
        error = f"rank {dist.get_rank()}: {_one_line(e)}"
    _agree(error, f"loading {path}", path.parent, saving=False)
    return meta
