"""``trainer.add_callback(RequeueCallback())``: a transformers ``Trainer`` or TRL ``SFTTrainer`` stops at Slurm's
notice,
saves its normal checkpoint of the stop step on every rank and exits with the contract's stopped code (75), so the
batch script requeues the job; the next run resumes with ``newest_complete_checkpoint``:

    trainer = SFTTrainer(..., callbacks=[RequeueCallback()])
    trainer.train(resume_from_checkpoint=newest_complete_checkpoint(args.output_dir))
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hpc.integrations.checkpoints import environ_arg, mark_complete
from hpc.node.attempt import Progress
from hpc.node.contract import EXIT_STOPPED
from hpc.node.stop_flag import StopFlag


class RequeueCallback(TrainerCallback):
    """After every optimizer step all ranks agree (one host-side all_reduce over a gloo group) whether any of them got
    a stop signal; if so, the Trainer saves that step's checkpoint (model or adapters, optimizer, scheduler, RNG, data
    position) and ends training, and the process exits with EXIT_STOPPED. Every checkpoint the Trainer saves gets the
    completeness marker once all ranks have written their part. Create it early: it catches the signals from then on
    (hpc.node.launch keeps a notice that came before)."""

    def __init__(self, environ=os.environ):
        environ = environ_arg(environ, "RequeueCallback")
        self.stop, self.environ = StopFlag(environ), environ
        self.stopped_at: int | None = None
        self.progress: Progress | None = (
            None  # a job with spare nodes: the resumed step and the steps, for hpc.node.restart
        )

    def _world(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    def on_train_begin(self, args, state, control, **kwargs):
        if dist.is_initialized() and self.stop.group is None:
            self.stop.join_all(self.environ)
        self.progress = Progress(dist.get_rank() if dist.is_initialized() else 0, self.environ)
        self.progress.loaded(state.global_step)  # the Trainer has loaded its checkpoint by now

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stepped(state.global_step)
        if state.global_step >= state.max_steps:  # the last step: training ends here anyway, and is done
            return
        if self.stopped_at is None and self.stop.agreed(state.global_step):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero:
                print(
                    f"[requeue] stopping after step {state.global_step} of {state.max_steps}: saving its checkpoint",
                    flush=True,
                )

    def on_save(self, args, state, control, **kwargs):
        if self.stop.group is not None:
            dist.barrier(group=self.stop.group)  # every rank has written its part
        path = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if args.should_save and path.is_dir():
            mark_complete(path, state.global_step, self._world())

    def on_train_end(self, args, state, control, **kwargs):
        if self.stopped_at is None:
            return
        if self.stop.group is not None:
            dist.barrier(group=self.stop.group)  # the marker is written before any rank reports the stop
        self.stop.ignore_further()
        if state.is_world_process_zero:
            print(
                f"[requeue] stopped at step {self.stopped_at} of {state.max_steps} after {self.stop.received}, "
                f"checkpoint saved; exiting {EXIT_STOPPED} for a requeue",
                flush=True,
            )
        raise SystemExit(EXIT_STOPPED)
