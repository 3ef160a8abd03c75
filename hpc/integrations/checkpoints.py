"""Which checkpoints of an output directory are complete: every rank finished writing them, and the
contract's completeness marker (`hpc.node.contract.CHECKPOINT_META`) was written last. The arguments of every
`hpc.integrations` call are checked where it is made: `IntegrationError` names the argument, in one line."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from hpc.node.cli import HpcError, shown
from hpc.node.contract import CHECKPOINT_META, checkpoint_step
from hpc.node.files import read_json_object

TRAINER_CHECKPOINT = re.compile(
    r"checkpoint-(\d+)"
)  # the Trainer's <PREFIX_CHECKPOINT_DIR>-<step> (light: no transformers import)


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


class IntegrationError(HpcError, ValueError):
    """A bad argument of an `hpc.integrations` call (a ValueError), raised by the call itself: one line naming it."""


def directory_arg(value, call: str, name: str, writable: bool = False) -> Path:
    """A directory argument: a non-empty path without NUL that is a directory or does not exist yet (``writable``: the
    nearest existing folder above it can be written, so it can be made); nothing is created."""
    if not isinstance(value, (str, os.PathLike)):
        raise IntegrationError(
            f"{call}({name}={shown(value)}): a directory path (str or os.PathLike), not {type(value).__name__}"
        )
    text = os.fspath(value)
    if isinstance(text, bytes) or not text.strip() or "\0" in text:
        raise IntegrationError(f"{call}({name}={shown(text)}): not a directory path (empty, or bytes, or with a NUL)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise IntegrationError(f"{call}({name}={shown(text)}): {path} exists and is not a directory")
    if writable:
        above = next(p for p in (path, *path.absolute().parents) if p.exists())
        if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
            raise IntegrationError(
                f"{call}({name}={shown(text)}): {above} "
                f"{'is not a directory' if not above.is_dir() else 'is not writable'}"
                f"{'' if above == path else f', so {path} cannot be made'}"
            )
    return path


def environ_arg(value, call: str) -> Mapping[str, str]:
    """The ``environ`` argument: a mapping of environment variables (os.environ), not a path or a string."""
    if not isinstance(value, Mapping):
        raise IntegrationError(
            f"{call}(environ={shown(value)}): a mapping of environment variables such as os.environ, "
            f"not {type(value).__name__} (was a path passed where the environment goes?)"
        )
    return value


def _marked_step(path: Path) -> int | None:
    """The step a checkpoint's completeness marker records, when it is a marker `mark_complete` wrote for that
    directory."""
    try:
        marker = read_json_object(path / CHECKPOINT_META)
    except (OSError, ValueError):
        return None
    step, world = marker.get("step"), marker.get("world_size")
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (step, world)) and world >= 1
    return step if ok and step == step_of(path.name) else None


def newest_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest complete checkpoint directory in ``output_dir``, for ``trainer.train(resume_from_checkpoint=...)``
    or `accelerate.Requeue.load`; None when there is none (a fresh start), never a half-written one. A checkpoint
    whose marker is damaged (not the marker of its step) is passed over for the next older complete one; a directory
    holding both the Trainer's (checkpoint-N) and `accelerate.Requeue`'s (step-NNNNNNNN) complete checkpoints is an
    IntegrationError (two scripts share it), as is an empty path (never the working directory)."""
    root = directory_arg(output_dir, "newest_complete_checkpoint", "output_dir")
    if not root.is_dir():
        return None
    complete = [
        (step, p)
        for p in root.iterdir()
        if step_of(p.name) is not None and p.is_dir() and (step := _marked_step(p)) is not None
    ]
    kinds = {bool(TRAINER_CHECKPOINT.fullmatch(p.name)) for _, p in complete}
    if len(kinds) > 1:
        raise IntegrationError(
            f"newest_complete_checkpoint(output_dir={shown(os.fspath(output_dir))}): it holds complete "
            "checkpoints of both the Trainer (checkpoint-N) and accelerate's Requeue (step-NNNNNNNN); "
            "give each script its own directory"
        )
    return str(max(complete)[1]) if complete else None
