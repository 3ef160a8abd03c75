"""The stop-and-requeue contract for a plain ``accelerate`` loop: two calls in the loop and a save/load pair on
``accelerator.save_state`` / ``load_state`` that also keeps the step and the data position.

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    requeue = Requeue(accelerator, "out/checkpoints")
    step = requeue.load()                       # 0, or the step of the newest complete checkpoint
    for batch in requeue.batches(loader):       # epoch after epoch, from the saved data position
        ...                                     # one optimizer step
        step += 1
        if step % 100 == 0:
            requeue.save(step)
        if step == max_steps:
            break
        requeue.stop_if_noticed(step)           # at Slurm's notice: all ranks save this step, exit 75

A checkpoint is ``step-NNNNNNNN`` in the directory (``.tmp`` appended while it is written), complete once it holds
the contract's marker; the requeued job's ``load()`` takes the newest complete one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator, Sized

import torch
import torch.distributed as dist

from hpc.integrations.checkpoints import (
    IntegrationError,
    directory_arg,
    environ_arg,
    mark_complete,
    newest_complete_checkpoint,
)
from hpc.node.attempt import Progress
from hpc.node.cli import shown
from hpc.node.contract import CHECKPOINT_META, EXIT_STOPPED, checkpoint_name, checkpoint_step
from hpc.node.files import read_json_object
from hpc.node.stop_flag import StopFlag


class Requeue:
    """Catches Slurm's stop signals from its creation on (create it right after the ``Accelerator``); ``keep_last``
    complete checkpoints are kept. The data position is the number of batches ``batches()`` has yielded, restored
    by skipping as many (``accelerator.skip_first_batches``) with each epoch's sampler seeded by ``set_epoch``; the
    loader's own draws from torch's RNG (a DataLoader takes one per epoch) are kept out of the training's RNG
    stream, so a resumed run draws the same dropout masks as an uninterrupted one."""

    def __init__(self, accelerator, directory: str | os.PathLike, keep_last: int = 2, environ=os.environ):
        # every argument checked here, before the signals are caught: an IntegrationError naming it
        self.directory = directory_arg(directory, "Requeue", "directory", writable=True)
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise IntegrationError(
                f"Requeue(keep_last={shown(keep_last)}): a whole number of checkpoints to keep, at least 1"
            )
        environ = environ_arg(environ, "Requeue")
        self.accelerator, self.keep_last = accelerator, keep_last
        self.stop = StopFlag(environ)
        if dist.is_initialized():
            self.stop.join_all(environ)
        self.batches_seen = 0
        self._saved: int | None = None
        # a job with spare nodes: for hpc.node.restart (the rank is accelerate's process_index, the group's rank)
        self.progress = Progress(dist.get_rank() if dist.is_initialized() else 0, environ)

    def load(self) -> int:
        """Load the newest complete checkpoint's state (model, optimizer, scheduler, RNG, registered objects) and
        data position; its step, or 0 when there is none."""
        path = newest_complete_checkpoint(self.directory)
        self.progress.loading()
        if path is None:
            self.progress.loaded(0)
            return 0
        self.accelerator.load_state(path)
        meta = read_json_object(Path(path) / CHECKPOINT_META)
        self.batches_seen = meta["batches"]
        self.progress.loaded(meta["step"])
        self.accelerator.print(f"[requeue] resumed from {path} (step {meta['step']}, batch {self.batches_seen})")
        return meta["step"]

    def batches(self, loader: Sized) -> Iterator:
        """The loader's batches epoch after epoch, starting after the ones already trained on; a loader without batches
        (or without a length) is an IntegrationError here, not an endless loop."""
        try:
            per_epoch = len(loader)
        except TypeError:
            raise IntegrationError(
                f"Requeue.batches(loader={shown(loader)}): the loader has no length; give a DataLoader "
                "over a dataset of known size"
            ) from None
        if per_epoch < 1:
            raise IntegrationError(
                f"Requeue.batches(loader={shown(loader)}): the loader has no batches (length 0): nothing to train on"
            )
        return self._batches(loader, per_epoch)

    def _batches(self, loader: Sized, per_epoch: int) -> Iterator:
        epoch, skip = divmod(self.batches_seen, per_epoch)
        while True:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            batches = iter(self.accelerator.skip_first_batches(loader, skip) if skip else loader)
            while True:
                with torch.random.fork_rng(devices=[]):  # the loader's own draws (its workers' seeds) stay out
                    batch = next(batches, None)
                if batch is None:
                    break
                self.batches_seen += 1
                yield batch
            epoch, skip = epoch + 1, 0

    def save(self, step: int) -> str:
        """Every rank saves its state of ``step`` (written as ``.tmp``, renamed when all are done); the path."""
        acc = self.accelerator
        final = self.directory / checkpoint_name(step)
        tmp = final.with_name(final.name + ".tmp")
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)  # an earlier run's unfinished save of this step
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()  # every rank has written its part
        if acc.is_main_process:
            mark_complete(tmp, step, acc.num_processes, batches=self.batches_seen)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            self._prune()
        acc.wait_for_everyone()
        self._saved = step
        return str(final)

    def _prune(self) -> None:
        complete = sorted(p for p in self.directory.iterdir() if checkpoint_step(p.name) is not None)
        for old in complete[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def stop_if_noticed(self, step: int) -> None:
        """After each optimizer step: when any rank got a stop signal, all save ``step`` together (unless just
        saved) and the process exits with EXIT_STOPPED, so the batch script requeues the job."""
        self.progress.stepped(step)
        if not self.stop.agreed(step):
            return
        if self._saved != step:
            self.save(step)
        self.stop.ignore_further()
        self.accelerator.print(
            f"[requeue] stopped at step {step} after {self.stop.received}, checkpoint saved; "
            f"exiting {EXIT_STOPPED} for a requeue"
        )
        raise SystemExit(EXIT_STOPPED)
