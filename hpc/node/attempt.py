"""What one start of the ranks (an attempt, in a job with spare nodes) leaves for the restart supervisor
(`hpc.node.restart`), in the directory ``HPC_ATTEMPT_DIR`` names; outside such a job nothing is written.

* ``start-rank-R.json`` / ``start-task-T.json``: hpc.node.launch started the rank program (or a per-node launcher):
  its node, pid and Slurm step;
* ``exit-rank-R.json`` / ``exit-task-T.json``: how it ended (exit code, or the signal that killed it);
* ``collective-R.json``: rank R's collective failed (a timeout, or a peer's process ended), with the ranks that
  arrived at the hang report and those missing (`hpc.node.hang`);
* ``fault-R.json``: rank R ended on an exception the fault table judged (`hpc.node.fault_table`): its type, code
  and cause;
* ``beat-R.json``: rank R's heartbeat: its phase, since when, and its thread's last run (`hpc.node.heartbeat`);
* ``progress.json``: rank 0's checkpoint load and steps in this attempt (the trainer, `hpc.integrations`);
* ``marks/``: the attempt's bad-node marks (``HPC_BAD_NODE_MARKS``: a rank missing at a timeout, a persistent
  straggler).

Times are ``time.time()`` seconds. Every file is written whole (a temporary file renamed), so a reader never sees
half of one.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from hpc.node.contract import ATTEMPT_DIR_VAR
from hpc.node.files import read_json_object

PROGRESS = "progress.json"
MARKS = "marks"


def attempt_dir(environ: Mapping[str, str] = os.environ) -> Optional[Path]:
    """This attempt's directory; None outside a job with spare nodes."""
    text = environ.get(ATTEMPT_DIR_VAR)
    return Path(text) if text else None


def write_json(path: Path, data: dict) -> None:
    """``data`` as ``path``, whole or not at all."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def _name(kind: str, rank: Optional[int], task: Optional[int]) -> str:
    return f"{kind}-rank-{rank}.json" if rank is not None else f"{kind}-task-{task}.json"


def _ident(environ: Mapping[str, str], rank_level: bool) -> tuple[Optional[int], Optional[int]]:
    """(rank, task) of this process: the rank for a rank program's supervisor, else the Slurm task."""

    def number(name: str) -> Optional[int]:
        text = environ.get(name, "")
        return int(text) if text.isdigit() else None

    return (number("RANK") if rank_level else None), number("SLURM_PROCID")


def record_start(environ: Mapping[str, str], who: str, node: str, pid: int, rank_level: bool) -> None:
    """hpc.node.launch started ``pid`` (the rank program, or a per-node launcher when not ``rank_level``)."""
    directory = attempt_dir(environ)
    if directory is None:
        return
    rank, task = _ident(environ, rank_level)
    write_json(
        directory / _name("start", rank, task),
        {
            "who": who,
            "rank": rank,
            "task": task,
            "node": node,
            "pid": pid,
            "supervisor_pid": os.getpid(),
            "step": environ.get("SLURM_STEP_ID"),
            "at": time.time(),
        },
    )


def record_exit(environ: Mapping[str, str], who: str, node: str, returncode: int, rank_level: bool) -> None:
    """How the program ended: ``returncode`` as subprocess gives it (negative: killed by that signal)."""
    directory = attempt_dir(environ)
    if directory is None:
        return
    rank, task = _ident(environ, rank_level)
    sig = None
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
    write_json(
        directory / _name("exit", rank, task),
        {
            "who": who,
            "rank": rank,
            "task": task,
            "node": node,
            "rc": returncode if returncode >= 0 else 128 - returncode,
            "signal": sig,
            "at": time.time(),
        },
    )


def record_collective(
    rank: int,
    node: str,
    failure: str,
    step: Optional[int],
    failed_at: float,
    elapsed_s: float,
    arrived: Optional[list[int]],
    missing: list[int],
    nodes: list[str],
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Rank ``rank``'s collective failed with ``failure`` ("timeout" or "peer ended", `hpc.node.hang`) at
    ``failed_at``, ``elapsed_s`` into the step after ``step``; ``arrived`` at the hang report (None: the store did not
    answer), ``missing`` the ranks that did not; ``nodes``: every rank's node."""
    directory = attempt_dir(environ)
    if directory is None:
        return
    write_json(
        directory / f"collective-{rank}.json",
        {
            "rank": rank,
            "node": node,
            "failure": failure,
            "step": step,
            "failed_at": failed_at,
            "step_started_at": failed_at - elapsed_s,
            "arrived": arrived,
            "missing": missing,
            "missing_nodes": sorted({nodes[r] for r in missing}),
            "nodes": nodes,
            "at": time.time(),
        },
    )


def record_fault(rank: int, node: str, verdict: dict, environ: Mapping[str, str] = os.environ) -> None:
    """Rank ``rank`` on ``node`` ends on an exception judged ``verdict`` (`hpc.node.fault_table.Verdict`'s fields and
    its signature)."""
    directory = attempt_dir(environ)
    if directory is None:
        return
    write_json(directory / f"fault-{rank}.json", {"rank": rank, "node": node, **verdict, "at": time.time()})


class Progress:
    """Rank 0's checkpoint load and steps in this attempt (``progress.json``); does nothing on other ranks or outside
    a job with spare nodes. The restart supervisor reads from it how long a restart took to train again."""

    def __init__(self, rank: int, environ: Mapping[str, str] = os.environ):
        directory = attempt_dir(environ)
        self.path = directory / PROGRESS if directory is not None and rank == 0 else None
        self.data: dict = {}

    def _write(self) -> None:
        if self.path is not None:
            try:
                write_json(self.path, self.data)
            except OSError:  # the record is for the report; training goes on without it
                pass

    def loading(self) -> None:
        """A checkpoint load starts."""
        self.data["load_started_at"] = time.time()
        self._write()

    def loaded(self, step: int) -> None:
        """The run resumed at ``step`` (0: no checkpoint)."""
        self.data.update(loaded_at=time.time(), resumed_step=step)
        self._write()

    def stepped(self, step: int) -> None:
        """Step ``step`` is done; the first one of the attempt is when it trains again."""
        now = time.time()
        self.data.setdefault("trained_at", now)
        self.data.update(step=step, step_at=now)
        self._write()


@dataclass
class Records:
    """Everything an attempt's directory holds (`read`)."""

    starts: list[dict] = field(default_factory=list)
    exits: list[dict] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)
    beats: list[dict] = field(default_factory=list)
    marked: list[str] = field(default_factory=list)
    progress: dict = field(default_factory=dict)


def read(directory: Path) -> Records:
    """The records of an attempt's directory (a file that cannot be read yet is left for the next look)."""
    out = Records()
    try:
        names = sorted(p.name for p in Path(directory).iterdir())
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            data = read_json_object(Path(directory) / name)
        except (OSError, ValueError):  # not yet whole, not JSON, not an object, not a small regular file
            continue
        if name.startswith("start-"):
            out.starts.append(data)
        elif name.startswith("exit-"):
            out.exits.append(data)
        elif name.startswith("collective-"):
            out.notes.append(data)
        elif name.startswith("fault-"):
            out.faults.append(data)
        elif name.startswith("beat-"):
            out.beats.append(data)
        elif name == PROGRESS:
            out.progress = data
    try:
        out.marked = sorted(p.name for p in (Path(directory) / MARKS).iterdir())
    except OSError:
        pass
    return out
