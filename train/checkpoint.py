"""Distributed checkpoints: DCP save/load that reshards across dp x tp layouts, atomic commit, retention.

Layout under the checkpoint root::

    step-00000100/            complete: renamed from .tmp only after every rank finished
      .metadata, __*.distcp   trainable weights + optimizer (torch.distributed.checkpoint, sharded)
      rng-rank*.pt            each rank's RNG states
      meta.json               the COMPLETE marker: step, layout, data stream state, the settings the state was
                              written with, and the manifest (every file's size and CRC-32); written last
    step-00000200.tmp-<run>/  incomplete (that run crashed while saving): removed by a later run of the job
    step-00000150.bad-.../    damaged (a file missing, short or not matching its CRC): set aside, never loaded or
                              pruned again

Files, meta.json and the directories are fsynced before and after the rename. A save is started (``start_save``:
the state is copied to host memory, then written, in the background with a stager) and committed (``commit``: every
rank waits for its writes, the files are checksummed by all ranks, rank 0 writes meta.json and renames); ``save``
does both at once. Whatever goes wrong in a save is a `CheckpointError` on every rank, and the previous checkpoints
stay. Loading tells damage (``verify``: `CheckpointDamaged`, the caller sets the checkpoint aside) from any other
failure (a `CheckpointError`: out of memory, I/O, a timeout; nothing is set aside and a later start tries again).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import zlib
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
from hpc.node.contract import CHECKPOINT_PREFIX, EXIT_FAILED, SET_ASIDE, checkpoint_name, checkpoint_step
from hpc.node.files import META_BYTES, read_json_object
from hpc.node.hang import collective_failure

# Only trainable parameters are saved: all of them in a full fine-tune, the adapters of a LoRA run (whose frozen
# base comes from model.path or the seed at every start).
# DCP's load fails on any of them missing from the files; setting them leaves the frozen ones (not strict) alone.
TRAINABLE = StateDictOptions(ignore_frozen_params=True)
SET_TRAINABLE = StateDictOptions(ignore_frozen_params=True, strict=False)


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / checkpoint_name(step)


class CheckpointError(HpcError):
    """A save or load that failed (the run failed: exit 1); the message is one line."""

    code = EXIT_FAILED


class CheckpointDamaged(CheckpointError):
    """A checkpoint's files do not match its manifest: it is set aside and the next older one tried."""


def _manifest_problem(path: Path) -> tuple[dict, str | None]:
    """meta.json and the first way the directory differs from its manifest (None: every file there with its size).
    An I/O error other than a missing file is raised."""
    try:
        meta = read_json_object(path / META, META_BYTES)
        for name, size in meta["files"].items():
            have = (path / name).stat().st_size
            if have != size:
                return meta, f"{name} has {have} bytes, the manifest says {size}"
    except FileNotFoundError as e:
        return {}, f"{Path(e.filename).name} is missing"
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, f"{META} is not a checkpoint manifest"
    return meta, None


def is_complete(path: Path) -> bool:
    """meta.json is there and every file of its manifest is there with its size."""
    try:
        return _manifest_problem(Path(path))[1] is None
    except OSError:
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


def committed_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint that a save committed (named step-N, whole or not), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((step, d) for d in root.iterdir() if (step := checkpoint_step(d.name)) is not None and d.is_dir())


def set_aside_checkpoints(root: Path) -> list[Path]:
    """The checkpoints set aside as damaged under ``root``, by name."""
    root = Path(root)
    return (
        sorted(d for d in root.iterdir() if d.name.startswith(CHECKPOINT_PREFIX) and SET_ASIDE in d.name)
        if root.is_dir()
        else []
    )


def set_aside(path: Path, reason: str) -> Path:
    """Rename a damaged checkpoint so that it is never loaded or pruned again; returns the new path."""
    target = path.with_name(f"{path.name}{SET_ASIDE}{time.strftime('%Y%m%d-%H%M%S')}")
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


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def _checksums(directory: Path, names: list[str]) -> dict[str, int]:
    """CRC-32 of ``names`` under ``directory``, each rank a share (collective); every rank gets all of them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine, error = {}, None
    try:
        mine = {name: _crc32(directory / name) for name in names[rank::world]}
    except OSError as e:
        error = f"rank {rank}: {e.strerror} ({e.filename})"
    shares = [None] * world
    dist.all_gather_object(shares, (mine, error))
    if first := next((err for _, err in shares if err), None):
        raise OSError(first)
    return {name: crc for share, _ in shares for name, crc in share.items()}


def verify(path: Path) -> dict:
    """Check a committed checkpoint against its manifest (sizes, and CRC-32s where it has them; collective).
    Returns its meta; raises CheckpointDamaged on every rank when a file is missing, short or altered."""
    meta, problem, error = {}, None, None
    try:
        meta, problem = _manifest_problem(Path(path))
    except OSError as e:  # not damage: an I/O error reading it
        error = f"rank {dist.get_rank()}: {e.strerror} ({e.filename})"
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, (problem, error))
    if first := next((p for p, _ in found if p), None):
        raise CheckpointDamaged(f"checkpoint {path} is damaged: {first}")
    if first := next((e for _, e in found if e), None):
        raise CheckpointError(f"reading {path} to check it failed: {first}; nothing was set aside")
    if "crc32" in meta:
        try:
            got = _checksums(Path(path), sorted(meta["crc32"]))
        except OSError as e:
            raise CheckpointError(f"reading {path} to check it failed: {e}; nothing was set aside") from None
        bad = sorted(name for name, crc in meta["crc32"].items() if got[name] != crc)
        if bad:
            raise CheckpointDamaged(f"checkpoint {path} is damaged: {', '.join(bad[:5])} do not match their CRC-32")
    return meta


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints; returns what was deleted."""
    old = [path for _, path in complete_checkpoints(root)[:-keep_last]]
    for path in old:
        shutil.rmtree(path)
    return old


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
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
    blocked_s: (
        float  # how long start_save blocked: the copy to host memory, or the whole write when not in the background
    )


def host_stager(pinned: bool) -> AsyncStager:
    """Copies the state to host memory so training can go on while it is written; ``pinned`` (GPU): into pinned
    buffers allocated at the first save and reused by the next ones."""
    return BlockingAsyncStager(cache_staged_state_dict=pinned)


def tmp_dirs(root: Path) -> list[Path]:
    """Checkpoints being written, or left half-written by a run that crashed: step-N.tmp-<run id>."""
    return sorted(Path(root).glob(f"{CHECKPOINT_PREFIX}*.tmp*")) if Path(root).is_dir() else []


def start_save(
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict,
    keep_last: int,
    run_id: str,
    stager: AsyncStager | None = None,
    write_group: dist.ProcessGroup | None = None,
) -> PendingSave:
    """Begin a checkpoint of ``step`` (collective) in ``step-N.tmp-<run_id>``. With ``stager`` the state is copied to
    host memory and written by a background thread that talks over ``write_group`` (a gloo group of its own); without,
    it is written now."""
    rank = dist.get_rank()
    final = step_dir(root, step)
    tmp = final.with_name(f"{final.name}.tmp-{run_id}")
    error = None
    if rank == 0:
        try:
            for stale in Path(root).glob(f"{CHECKPOINT_PREFIX}*.tmp-{run_id}"):  # this run's save that failed
                shutil.rmtree(stale)
            tmp.mkdir(parents=True)
        except OSError as e:
            error = f"cannot create {tmp} ({e.strerror})"
    _agree(error, f"checkpoint of step {step}", root)
    t0 = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINABLE)
    error = None
    try:
        rng = tmp / f"rng-rank{rank}.pt"
        torch.save(rng_state(), rng)
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
        collective = _collective_error(e)
        if collective is not None:  # a peer ended or is silent (its node lost mid-write): the run's hang report
            raise collective from None
        raise CheckpointError(
            f"checkpoint of step {step} in {tmp} failed: {_one_line(e)}{_free_space(root)}; "
            "the previous checkpoints are kept"
        ) from None
    return PendingSave(future, step, tmp, final, meta, keep_last, stager is not None, time.perf_counter() - t0)


def _collective_error(e: BaseException) -> BaseException | None:
    """The error of a collective that failed under ``e`` (a save's, DCP's own or one rank's in its
    CheckpointException), which hpc.node.hang names as a peer that ended or timed out; None for any other error."""
    errors = [exc for exc, _ in e.failures.values()] if isinstance(e, CheckpointException) else [e]
    return next((x for x in errors if isinstance(x, RuntimeError) and collective_failure(x) is not None), None)


def _agree(error: str | None, what: str, root: Path, saving: bool = True, after: str = "") -> None:
    """Raise CheckpointError on every rank when any rank had ``error`` (collective)."""
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        kept = "; the previous checkpoints are kept" if saving else ""
        raise CheckpointError(f"{what} failed: {first}{_free_space(root)}{kept}{after}")


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
    names = [None]
    if dist.get_rank() == 0:
        names[0] = sorted(p.name for p in pending.tmp.iterdir() if p.is_file())
    dist.broadcast_object_list(names, src=0)
    error = None
    try:
        crc32 = _checksums(pending.tmp, names[0])
    except OSError as e:
        error = str(e)
    _agree(error, f"checksumming checkpoint step {pending.step} in {pending.tmp}", pending.final.parent)
    if dist.get_rank() == 0:
        try:
            files = {name: (pending.tmp / name).stat().st_size for name in names[0]}
            meta = {
                "step": pending.step,
                "world_size": dist.get_world_size(),
                "saved_at": time.time(),
                **pending.meta,
                "files": files,
                "crc32": crc32,
            }
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


def save(
    root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict, keep_last: int, run_id: str
) -> Path:
    """Save a checkpoint of ``step`` now (collective). ``meta`` (JSON) is written last, as the COMPLETE marker."""
    return commit(start_save(root, step, model, optimizer, meta, keep_last, run_id))


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load a verified checkpoint's model and optimizer into the current layout (collective); restores RNG states if
    the world size matches. Returns meta; a failure on any rank is a CheckpointError (not damage) on every rank."""
    path = Path(path)
    meta = verify(path)
    error = None
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINABLE)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=SET_TRAINABLE
        )
        if meta["world_size"] == dist.get_world_size():
            set_rng_state(torch.load(path / f"rng-rank{dist.get_rank()}.pt", weights_only=False))
    except (Exception, CheckpointException) as e:  # its files match the manifest: out of memory, I/O, a timeout
        error = f"rank {dist.get_rank()}: {_one_line(e)}"
    _agree(
        error, f"loading {path}", path.parent, saving=False, after="; nothing was set aside, a later start tries again"
    )
    return meta
