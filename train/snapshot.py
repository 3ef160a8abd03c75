"""Memory snapshots (``checkpoint.memory_every``): every few steps each rank's state in its node's memory and in its
partner's, so that an in-job restart after a node's loss resumes from there instead of the last disk checkpoint.

Layout, on every node (tmpfs; ``HPC_SNAPSHOT_DIR``, default /dev/shm/hpc-snapshots)::

    <job id>.<run>/<node>/step-00000012/
        rank-00002.pt      a rank's state: its own (a rank of this node) or a partner copy (of the previous node's)
        done-rank-00002    written by each rank of this node once every rank's own and partner copy of the step
                           was written (agreed by all): the step is complete

A rank's state is what the disk checkpoint holds for it (``train.checkpoint``): the trainable weights and the optimizer
(this rank's shards, as ``get_state_dict`` gives them), its RNG states, the data position and the step. It is copied
to host memory by the checkpoint's host stager (pinned on a GPU) while the step loop waits; a background thread then
serialises it, writes it to the node's directory, sends it to the partner over a gloo group of its own and writes
the copy it receives, agrees with all ranks and marks the step complete; the older steps are then removed. The files
are per rank and per layout: only the same ranks (an in-job restart) load them.

A resume compares the newest step complete for every rank (from its own node, or sent by the node holding its
partner copy) with the newest disk checkpoint, and all ranks load the newer (``Trainer._resume``).
"""

from __future__ import annotations

import io
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from hpc.node.contract import checkpoint_name, checkpoint_step
from hpc.node.files import NotASmallFile, read_small
from train import checkpoint
from train.snapshot_plan import Choice, Found, choose, partners, sender_of

DONE = "done-rank-{rank:05d}"
STATE = "rank-{rank:05d}.pt"


def _local(tree):
    """The state with each DTensor replaced by this rank's shard (a view, no copy)."""
    if isinstance(tree, DTensor):
        return tree.to_local()
    if isinstance(tree, dict):
        return {k: _local(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_local(v) for v in tree]
    return tree


def _fill(into, saved, where: str = "state"):
    """Copy ``saved`` (a `_local` state) into the tensors of ``into`` (the same structure); returns ``into`` with its
    other values replaced by the saved ones. ValueError on any difference of keys or shapes."""
    if isinstance(into, torch.Tensor):
        local = into.to_local() if isinstance(into, DTensor) else into
        if not isinstance(saved, torch.Tensor) or saved.shape != local.shape or saved.dtype != local.dtype:
            shape = getattr(saved, "shape", type(saved).__name__)
            raise ValueError(f"{where}: saved {shape}, now {tuple(local.shape)}")
        local.copy_(saved)
        return into
    if isinstance(into, dict):
        if not isinstance(saved, dict) or saved.keys() != into.keys():
            raise ValueError(f"{where}: the saved keys differ")
        for k in into:
            into[k] = _fill(into[k], saved[k], f"{where}.{k}")
        return into
    return saved


def _read(path: Path) -> bytes:
    """A state file, whole (a regular file only: `hpc.node.files`)."""
    return read_small(path, os.stat(path).st_size)


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _exchange(data: bytes | None, to: int | None, source: int | None, group) -> bytes | None:
    """Send ``data`` to rank ``to`` and receive from rank ``source`` (either None: not), over ``group``."""
    size_out, size_in = torch.tensor([len(data) if data is not None else 0]), torch.zeros(1, dtype=torch.int64)
    works = [dist.isend(size_out, to, group=group)] if to is not None else []
    works += [dist.irecv(size_in, source, group=group)] if source is not None else []
    for w in works:
        w.wait()
    works, got = [], None
    if to is not None and data:
        works.append(dist.isend(torch.frombuffer(bytearray(data), dtype=torch.uint8), to, group=group))
    if source is not None:
        got = torch.empty(int(size_in.item()), dtype=torch.uint8)
        if got.numel():
            works.append(dist.irecv(got, source, group=group))
    for w in works:
        w.wait()
    return None if got is None else got.numpy().tobytes()


class Snapshots:
    """This rank's memory snapshots; ``nodes``: every rank's node, by rank (collective: makes a gloo group)."""

    def __init__(self, every: int, job_dir: Path, nodes: list[str], pinned: bool):
        self.every, self.job_dir, self.nodes = every, job_dir, nodes
        self.rank = dist.get_rank()
        self.node_dir = job_dir / nodes[self.rank]
        self.partner = partners(nodes)
        self.sender = sender_of(self.partner, self.rank)
        self.group = dist.new_group(backend="gloo")  # the writer thread's exchange and agreement, the resume's sends
        self.stager = checkpoint.host_stager(pinned)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="snapshot")
        self.pending: Future | None = None
        self.last: dict = {}  # the newest finished snapshot's numbers, for the log

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def start(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict) -> float:
        """Copy this rank's state of ``step`` to host memory and write and send it in the background (collective once
        the previous snapshot is waited for); returns the seconds the caller was blocked."""
        t0 = time.perf_counter()
        self.wait()
        model_sd, optim_sd = get_state_dict(model, optimizer, options=checkpoint.TRAINABLE)
        staged = self.stager.stage({"model": _local(model_sd), "optim": _local(optim_sd)})
        state = {**staged, "rng": checkpoint.rng_state(), "step": step, "world_size": len(self.nodes), **extra}
        self.pending = self.pool.submit(self._write_step, step, state)
        return time.perf_counter() - t0

    def _write_step(self, step: int, state: dict) -> dict:
        """In the writer thread: own copy, partner copy, agreement, completion marker, older steps removed."""
        t0 = time.perf_counter()
        directory = self.node_dir / checkpoint_name(step)
        error, data = None, b""
        try:
            buf = io.BytesIO()
            torch.save(state, buf)
            data = buf.getvalue()
            directory.mkdir(parents=True, exist_ok=True)
            _write(directory / STATE.format(rank=self.rank), data)
        except (OSError, RuntimeError) as e:
            error = f"rank {self.rank} on {self.nodes[self.rank]}: {e}"
        got = _exchange(data, self.partner[self.rank], self.sender, self.group)
        try:
            if got:
                _write(directory / STATE.format(rank=self.sender), got)
            else:
                error = error or f"rank {self.rank}: rank {self.sender} sent no state"
        except OSError as e:
            error = error or f"rank {self.rank} on {self.nodes[self.rank]}: {e}"
        errors: list = [None] * len(self.nodes)
        dist.all_gather_object(errors, error, group=self.group)
        first = next((e for e in errors if e), None)
        if first is None:
            try:
                (directory / DONE.format(rank=self.rank)).touch()
                self._remove_older(step)
            except OSError as e:  # this node's copy is not marked: the older one stays, the others' copies count
                first = f"rank {self.rank} on {self.nodes[self.rank]}: marking it complete: {e}"
        return {"step": step, "bytes": len(data), "written_s": time.perf_counter() - t0, "error": first}

    def _remove_older(self, step: int) -> None:
        """The node's steps before ``step`` (complete everywhere now); the other rank of the node may race: ignored."""
        for d in self.node_dir.iterdir():
            s = checkpoint_step(d.name)
            if s is not None and s < step:
                shutil.rmtree(d, ignore_errors=True)

    def wait(self) -> dict:
        """Wait for the snapshot in flight (if any); its numbers (step, bytes, written_s, error)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self.last = pending.result()
            if self.last["error"] and self.rank == 0:
                print(f"[train] memory snapshot of step {self.last['step']} failed: {self.last['error']}", flush=True)
        return self.last

    def found(self) -> Found:
        """What this rank's node directory holds."""
        files: dict[int, list[int]] = {}
        complete = []
        if self.node_dir.is_dir():
            for d in self.node_dir.iterdir():
                step = checkpoint_step(d.name)
                if step is None:
                    continue
                names = {p.name for p in d.iterdir()}
                files[step] = [r for r in range(len(self.nodes)) if STATE.format(rank=r) in names]
                if any(n.startswith("done-rank-") for n in names):
                    complete.append(step)
        return Found(self.nodes[self.rank], files, sorted(complete))

    def choice(self, disk_step: int | None) -> Choice | None:
        """The snapshot every rank resumes from, or None (collective: every rank's `found`, one decision)."""
        mine = None
        try:
            mine = self.found()
        except OSError:
            mine = Found(self.nodes[self.rank], {}, [])
        found: list = [None] * len(self.nodes)
        dist.all_gather_object(found, mine, group=self.group)
        return choose(found, disk_step)

    def load(self, choice: Choice, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Load ``choice`` on every rank (collective): each rank's state from its node, or sent by the rank holding it.
        Returns the state's other entries (data position, tracker ids, step); None when a state could not be read or
        does not fit (nothing loaded: the caller resumes from the disk); a failure after the weights were touched is a
        CheckpointError."""
        step_dir = self.node_dir / checkpoint_name(choice.step)
        data, error = None, None
        try:
            if self.nodes[choice.source[self.rank]] == self.nodes[self.rank]:
                data = _read(step_dir / STATE.format(rank=self.rank))
        except (OSError, NotASmallFile) as e:
            error = f"rank {self.rank}: {e}"
        for src, dst in choice.transfers(self.nodes):
            if self.rank == src:
                try:
                    out = _read(step_dir / STATE.format(rank=dst))
                except (OSError, NotASmallFile):
                    out = b""
                _exchange(out, dst, None, self.group)
            elif self.rank == dst:
                data = _exchange(None, None, src, self.group) or None
        state = None
        if data is None:
            error = error or f"rank {self.rank}: no state of step {choice.step} arrived"
        else:
            try:
                state = torch.load(io.BytesIO(data), weights_only=False)
                if state["step"] != choice.step or state["world_size"] != len(self.nodes):
                    error = f"rank {self.rank}: the state is of step {state['step']} on {state['world_size']} ranks"
            except Exception as e:  # a torn or foreign file: the disk checkpoint instead
                error = f"rank {self.rank}: {type(e).__name__}: {e}"
        if _first_error(error, self.group):
            return None
        try:
            model_sd, optim_sd = get_state_dict(model, optimizer, options=checkpoint.TRAINABLE)
            model_sd = _fill(model_sd, state["model"], "model")
            optim_sd = _fill(optim_sd, state["optim"], "optim")
            set_state_dict(
                model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=checkpoint.SET_TRAINABLE
            )
            checkpoint.set_rng_state(state["rng"])
        except (ValueError, RuntimeError, KeyError) as e:
            error = f"rank {self.rank}: {type(e).__name__}: {e}"
        first = _first_error(error, self.group)
        if first:
            raise checkpoint.CheckpointError(f"loading the memory snapshot of step {choice.step} failed: {first}")
        return {k: v for k, v in state.items() if k not in ("model", "optim", "rng")}

    def close(self, remove: bool) -> None:
        """Wait for the snapshot in flight; ``remove`` (the run ended: done or stopped, never restarted within this
        job run): every node's first rank removes its node's directory, and the job's when it is empty."""
        self.wait()
        self.pool.shutdown()
        if not remove:
            return
        dist.barrier(group=self.group)
        if self.nodes.index(self.nodes[self.rank]) == self.rank:  # the node's first rank
            shutil.rmtree(self.node_dir, ignore_errors=True)
            try:
                self.job_dir.rmdir()
            except OSError:
                pass


def _first_error(error: str | None, group) -> str | None:
    errors: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    return next((e for e in errors if e), None)
