"""Sweeps as Slurm job arrays: ``--sweep KEY=V1,V2`` axes, their cartesian product as tasks, and
each task's overrides, directory name and owner; the task table (``sweep.json``) in the job directory."""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hpc.node.cli import HpcError, shown
from hpc.node.files import META_BYTES, read_json_object, read_small_text
from hpc.node.ownership import slug
from train.front.interface import CHECKPOINT_DIR_KEY, LOG_DIR_KEY, RUN_DIR_KEYS

DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize (array indices 0 to 1000)
MAX_ARRAY_SIZE = 4_000_001  # the largest MaxArraySize Slurm allows
SWEEP_FILE = "sweep.json"  # the task table of an array job, in its job directory
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_SLUG_MAX = 60


class SweepError(HpcError):
    """Bad --sweep / --max-parallel input; the message is one line naming the flag."""


@dataclass(frozen=True)
class SweepTask:
    index: int
    overrides: tuple[str, ...]  # key=value, one per axis
    dir_name: str  # under the job's log and checkpoint directories

    def owner(self, job_name: str) -> str:
        """The name that owns this task's directories: the job name, the index and the exact overrides."""
        return f"{job_name}[{self.index}] {' '.join(self.overrides)}"


@dataclass(frozen=True)
class Sweep:
    tasks: tuple[SweepTask, ...]
    max_parallel: Optional[int] = None

    @property
    def keys(self) -> list[str]:
        return [o.partition("=")[0] for o in self.tasks[0].overrides]

    @property
    def array(self) -> str:
        """sbatch's --array value: every task index, at most max_parallel at a time."""
        return f"0-{len(self.tasks) - 1}" + (f"%{self.max_parallel}" if self.max_parallel else "")


def split_values(text: str) -> list[str]:
    """``1e-4,3e-4`` -> ["1e-4", "3e-4"]; commas inside [...] or {...} belong to one YAML value."""
    values, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            values.append(cur)
            cur = ""
        else:
            cur += ch
    return values + [cur]


def parse_axes(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``KEY=V1,V2`` items as (key, values), checked for form, empty values and repeated keys."""
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not _KEY.fullmatch(key):
            raise SweepError(f"--sweep {shown(item)}: expected KEY=V1,V2,... with a config key such as optim.lr")
        if key in RUN_DIR_KEYS:
            raise SweepError(f"--sweep {key}: each task gets its own {key} (<{key}>/<task>); sweep another key")
        if any(key == k for k, _ in axes):
            raise SweepError(f"--sweep {key}: given twice; list all its values in one --sweep {key}=V1,V2")
        values = [v.strip() for v in split_values(text)]
        if not text.strip() or any(not v for v in values):
            raise SweepError(f"--sweep {shown(item)}: an empty value; give one or more values separated by commas")
        if any(ord(c) < 32 or c == "\x7f" for c in text):
            raise SweepError(f"--sweep {key}: a value holds a control character; values are one line of text")
        if len(set(values)) != len(values):
            raise SweepError(f"--sweep {shown(item)}: a value is repeated")
        axes.append((key, values))
    return axes


def dir_name(index: int, width: int, overrides: Sequence[str]) -> str:
    """``003-optim.lr=1e-4_micro_batch=2``: the task index (which makes it unique) and the overrides' slug, which keeps
    ``=`` and ``+``."""
    readable = slug("_".join(overrides), _SLUG_MAX, keep="=+")
    return f"{index:0{width}d}-{readable}" if readable else f"{index:0{width}d}"


def build_sweep(
    items: Sequence[str], max_parallel: Optional[int], max_tasks: int = DEFAULT_MAX_ARRAY_SIZE
) -> Optional[Sweep]:
    """The tasks of ``--sweep`` items (None without any), in the order of the cartesian product; at most
    ``max_tasks`` (the cluster's MaxArraySize: indices 0 to max_tasks - 1), counted before any is made."""
    if not items:
        if max_parallel is not None:
            raise SweepError("--max-parallel: limits the tasks of a sweep; give it with --sweep")
        return None
    if max_parallel is not None and max_parallel < 1:
        raise SweepError(f"--max-parallel {max_parallel}: must be at least 1")
    axes = parse_axes(items)
    count = math.prod(len(values) for _, values in axes)
    if count > max_tasks:
        raise SweepError(
            f"--sweep: {' x '.join(str(len(v)) for _, v in axes)} = {count} tasks; the cluster's MaxArraySize allows "
            f"{max_tasks} (submission.max_array_size in the profile, Slurm's default 1001)"
        )
    combos = list(itertools.product(*[[f"{key}={v}" for v in values] for key, values in axes]))
    width = len(str(len(combos) - 1))
    tasks = tuple(SweepTask(i, combo, dir_name(i, width, combo)) for i, combo in enumerate(combos))
    return Sweep(tasks, max_parallel)


def task_args(task: SweepTask, log_dir: Path, checkpoint_dir: Path) -> list[str]:
    """The trainer overrides of one task: its sweep values and its own log and checkpoint directories."""
    return [
        *task.overrides,
        f"{LOG_DIR_KEY}={log_dir / task.dir_name}",
        f"{CHECKPOINT_DIR_KEY}={checkpoint_dir / task.dir_name}",
    ]


def table_json(sweep: Sweep, job_name: str) -> str:
    return (
        json.dumps(
            {
                "job_name": job_name,
                "tasks": [{"index": t.index, "overrides": list(t.overrides), "dir": t.dir_name} for t in sweep.tasks],
            },
            indent=1,
        )
        + "\n"
    )


def write_table(sweep: Sweep, job_name: str, job_dir: Path) -> None:
    """Record the task table in the job directory; a different sweep already recorded there under this name is
    refused."""
    path = job_dir / SWEEP_FILE
    text = table_json(sweep, job_name)
    try:
        if path.exists() and read_small_text(path, META_BYTES) != text:
            raise SweepError(
                f"--sweep: job {shown(job_name)} already ran another sweep in {job_dir} ({SWEEP_FILE}); "
                "its tasks resume only with the same --sweep values: pick another job name"
            )
        job_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else str(e).replace(f"{path} ", "it ")
        raise SweepError(f"paths.job_dir: {path}: cannot write it ({why})") from None


def read_table(job_dir: Path) -> dict[int, tuple[tuple[str, ...], str]]:
    """index -> (overrides, directory name) from a job directory's sweep.json; {} when there is none."""
    path = job_dir / SWEEP_FILE
    try:
        data = read_json_object(path, META_BYTES)
        return {int(t["index"]): (tuple(t["overrides"]), str(t["dir"])) for t in data["tasks"]}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError):
        raise SweepError(f"{path}: unreadable task table") from None
