"""Which checkpoints of an output directory are complete: every rank finished writing them, and the
contract's completeness marker (`hpc.node.contract.CHECKPOINT_META`) was written last."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from hpc.node.contract import CHECKPOINT_META, checkpoint_step

TRAINER_CHECKPOINT = re.compile(r"checkpoint-(\d+)")  # the Trainer's <PREFIX_CHECKPOINT_DIR>-<step> (light: no transformers import)


def step_of(name: str) -> int | None:
    """The step of a Trainer checkpoint's (``checkpoint-12``) or `accelerate.Requeue`'s (``step-00000012``) name."""
    m = TRAINER_CHECKPOINT.fullmatch(name)
    return int(m.group(1)) if m else checkpoint_step(name)


def mark_complete(path: str | os.PathLike, step: int, world_size: int, **more: int) -> None:
    """Write the marker into a checkpoint that every rank has finished writing (atomically: a crash leaves none)."""
    marker = Path(path) / CHECKPOINT_META
    tmp = marker.with_name(f".{CHECKPOINT_META}.tmp")
    tmp.write_text(json.dumps({"step": step, "world_size": world_size, **more}) + "\n")
    os.replace(tmp, marker)


def newest_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest complete checkpoint directory in ``output_dir``, for ``trainer.train(resume_from_checkpoint=...)``
    or `accelerate.Requeue.load`; None when there is none (a fresh start), never a half-written one."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    complete = [(step, p) for p in root.iterdir()
                if (step := step_of(p.name)) is not None and (p / CHECKPOINT_META).is_file()]
    return str(max(complete)[1]) if complete else None
