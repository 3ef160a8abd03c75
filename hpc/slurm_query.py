"""What Slurm knows about a job: state, restarts, nodes and where its files are.

`scontrol show job` answers while slurmctld remembers the job (MinJobAge);
accounting (`sacct`) answers after that. A job's directory is the directory of
its batch output (StdOut), or, from accounting alone, of the ``--output`` in
the script that its submit line names.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from hpc.node.cli import HpcError, shown
from hpc.node.contract import ENDED_STATES
from hpc.node.files import META_BYTES, read_small_text
from hpc.node.tool import ToolMissing, ToolResult, ToolTimeout, run_tool
from hpc.sweep import MAX_ARRAY_SIZE

CLIENT_TIMEOUT_S = 10  # Slurm's clients retry for a long while when slurmctld is down
SEP = "\x1f"  # sacct's field delimiter: job names and submit lines may contain "|"
SACCT_FIELDS = (
    "JobIDRaw",
    "JobName",
    "State",
    "NNodes",
    "Elapsed",
    "Partition",
    "NodeList",
    "WorkDir",
    "SubmitLine",
    "JobID",
)
SQUEUE_FIELDS = ("JobIDRaw", "JobName", "State", "NNodes", "Elapsed")
# a job, one task of an array job (ARRAY_TASK, 123_4) or one component of a heterogeneous job (123+1)
JOB_ID = re.compile(r"([1-9][0-9]{0,9})(?:_(0|[1-9][0-9]{0,9})|\+(0|[1-9][0-9]{0,9}))?")
NULLS = ("(null)", "None", "Unknown", "N/A")  # how Slurm's clients write a field without a value
NAMED = ("JobName",)  # a user's text, never read as Slurm's empty value
MAX_JOB_ID = 2**32 - 1  # Slurm's ids are 32 bits: a larger number would wrap to another job; 0 means every job


class JobError(HpcError):
    """The job cannot be found or read; the message is one line."""


def job_id_problem(text: str) -> Optional[str]:
    """Why ``text`` is not a Slurm job id 1..2^32-1 (optionally ``_TASK``, an array task), or None."""
    m = JOB_ID.fullmatch(text) if text.isascii() else None
    if m is None or any(g and int(g) > MAX_JOB_ID for g in m.groups()):
        return (
            f"{shown(text)} is not a job id: a number 1..{MAX_JOB_ID}, ARRAY_TASK such as 123_4, or a heterogeneous "
            "job's component such as 123+1"
        )
    return None


def job_sort_key(job_id: str) -> tuple:
    """Sort jobs as squeue and sacct name them: 123, 123_4, 123_[5-9%2] (an array's pending tasks), 123+1 (a
    heterogeneous job's component), by job, then task or component; anything else last."""
    m = re.fullmatch(r"([0-9]+)(?:_([0-9]+)|_\[([0-9]+)[^]]*\]|\+([0-9]+))?", job_id)
    if m is None:
        return (1, 0, 0, job_id)
    job, task, pending, component = m.groups()
    return (0, int(job), int(task or pending or component or -1), job_id)


def job_id_arg(text: str) -> str:
    """argparse type: a job id (see `job_id_problem`)."""
    problem = job_id_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


@dataclass(frozen=True)
class Job:
    job_id: str
    name: str
    state: str
    nodes: int
    elapsed: str
    partition: str
    nodelist: str
    restarts: int
    stdout: Optional[Path]
    array_task: Optional[int] = None  # the task index of an array job's task
    reason: str = ""  # slurmctld's Reason (why it waits, or what ended it), "" from accounting alone
    excluded: str = ""  # the nodes it must not run on (ExcNodeList), "" for none
    exit_code: str = ""  # the batch script's EXIT:SIGNAL, "" from accounting alone

    @property
    def job_dir(self) -> Optional[Path]:
        """Where hpc.submit put the job's logs (and the trainer its metrics.jsonl)."""
        return self.stdout.parent if self.stdout else None

    @property
    def finished(self) -> bool:
        return self.state.split()[0] in ENDED_STATES


def check_controller(environ: Mapping[str, str] = os.environ, timeout_s: float = 3.0) -> None:
    """Fail in seconds when slurmctld does not answer: Slurm's own clients retry for 10 to 20 s.

    Reads SlurmctldHost and SlurmctldPort from $SLURM_CONF (else /etc/slurm/slurm.conf); without a
    readable slurm.conf (a configless client) nothing is checked."""
    path = Path(environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = read_small_text(path, META_BYTES)
    except (OSError, ValueError):
        return
    hosts = [
        m.group(2) or m.group(1)
        for m in re.finditer(
            r"^\s*(?:SlurmctldHost|ControlMachine)\s*=\s*([^\s(#]+)(?:\(([^)]+)\))?", text, re.M | re.I
        )
    ]
    port = re.search(r"^\s*SlurmctldPort\s*=\s*(\d+)", text, re.M | re.I)
    if not hosts:
        return
    port_no = int(port.group(1)) if port else 6817
    errors = []
    for host in hosts:
        try:
            socket.create_connection((host, port_no), timeout=timeout_s).close()
            return
        except OSError as e:
            errors.append(f"{host}:{port_no} ({e.strerror or e})")
    raise JobError(f"Slurm's controller does not answer at {', '.join(errors)} (from {path}): is slurmctld up?")


def run_slurm(argv: list[str]) -> ToolResult:
    """A Slurm client's answer (`run_tool` within CLIENT_TIMEOUT_S); JobError when it is missing or hangs."""
    try:
        return run_tool(argv, CLIENT_TIMEOUT_S)
    except ToolMissing:
        raise JobError(f"{argv[0]} is not on PATH: run this on a Slurm login node") from None
    except ToolTimeout:
        raise JobError(
            f"{argv[0]} got no answer within {CLIENT_TIMEOUT_S} s: is Slurm (slurmctld, or slurmdbd for sacct) up?"
        ) from None


def sacct_command(*args: str) -> list[str]:
    return ["sacct", "-X", "-D", "-n", "-P", f"--delimiter={SEP}", "-o", ",".join(SACCT_FIELDS), *args]


def parse_rows(tool: str, fields: tuple[str, ...], text: str) -> list[dict[str, str]]:
    """A client's delimited output as dicts of ``fields``; JobError naming the tool when a line has another number of
    fields (a truncated answer, another version's or another format)."""
    rows = []
    for line in text.splitlines():
        if not line:
            continue
        values = line.split(SEP)
        if len(values) != len(fields):
            raise JobError(
                f"{tool} answered a line of {len(values)} field(s), not the {len(fields)} asked for "
                f"({shown(line[:80])})"
            )
        rows.append({k: v if k in NAMED else no_null(v) for k, v in zip(fields, values, strict=True)})
    return rows


def no_null(value: str) -> str:
    """Slurm's empty value: ``(null)``, ``None``, ``Unknown`` and ``N/A`` are ""."""
    return "" if value.strip() in NULLS else value


def count(tool: str, key: str, value: str, default: int = 0) -> int:
    """A count Slurm answered: ASCII digits within 32 bits; JobError naming the field otherwise."""
    if not value:
        return default
    if not re.fullmatch(r"[0-9]{1,10}", value) or int(value) > MAX_JOB_ID:
        raise JobError(f"{tool} answered {key}={shown(value)}, not a count")
    return int(value)


def parse_sacct(text: str) -> list[dict[str, str]]:
    """sacct_command's output: one dict of SACCT_FIELDS per run of a job (requeues included)."""
    return parse_rows("sacct", SACCT_FIELDS, text)


def sacct_rows(*args: str) -> list[dict[str, str]]:
    """`sacct -X -D` rows (one per run of a job, requeues included) as dicts of SACCT_FIELDS."""
    r = run_slurm(sacct_command(*args))
    if r.returncode != 0:
        raise JobError(f"sacct failed: {r.stderr.strip()}")
    return parse_sacct(r.stdout)


def squeue_command(*args: str) -> list[str]:
    return ["squeue", "-h", "-o", SEP.join(("%i", "%j", "%T", "%D", "%M")), *args]


def parse_squeue(text: str) -> list[dict[str, str]]:
    """squeue_command's output: one dict of SQUEUE_FIELDS per live job."""
    return parse_rows("squeue", SQUEUE_FIELDS, text)


def squeue_rows(*args: str) -> list[dict[str, str]]:
    """`squeue` rows (live jobs) as dicts of SQUEUE_FIELDS.

    Live jobs come from slurmctld at once; accounting records a new job a moment later
    (first as "allocation", PENDING).
    """
    r = run_slurm(squeue_command(*args))
    if r.returncode != 0:
        raise JobError(f"squeue failed: {r.stderr.strip()}")
    return parse_squeue(r.stdout)


def restarts(rows: list[dict[str, str]]) -> int:
    """Requeues of one job from its sacct runs: every run but the last, and the last while it waits requeued."""
    return max(len(rows) - 1, 0) + bool(rows and rows[-1]["State"].startswith("REQUEUED"))


def scontrol_command(job_id: str) -> list[str]:
    return ["scontrol", "show", "job", "-o", job_id]


def parse_scontrol(text: str) -> dict[str, str]:
    """One line of scontrol_command's output as a dict of its KEY=VALUE pairs; values run until the next " Key="
    (JobName and paths may contain spaces)."""
    pairs = re.findall(r"(?:^| )([A-Za-z_:/]+)=(.*?)(?= [A-Za-z_:/]+=|$)", text.strip())
    if text.strip() and not pairs:
        raise JobError(f"scontrol answered {shown(text.strip()[:80])}, not KEY=VALUE pairs")
    return {k: v if k in NAMED else no_null(v) for k, v in pairs}


def scontrol_records(job_id: str) -> list[dict[str, str]]:
    """`scontrol show job -o` as dicts, one per line (an array job has one per task or pending range);
    [] once slurmctld no longer remembers the job."""
    r = run_slurm(scontrol_command(job_id))
    return [parse_scontrol(line) for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else []


def scontrol_fields(job_id: str) -> dict[str, str]:
    """The job's `scontrol show job -o` record as a dict, {} once slurmctld no longer remembers it (or when
    ``job_id`` names a whole array job: see `array_tasks`)."""
    records = scontrol_records(job_id)
    return records[0] if len(records) == 1 and not (records[0].get("ArrayTaskId") and "_" not in job_id) else {}


def expand_indices(text: str) -> list[int]:
    """Slurm's task index lists: ``3``, ``0-3``, ``[0-2,5]``, ``0-7%2`` -> the indices; JobError when an index is past
    Slurm's largest array (MaxArraySize at most 4,000,001: indices up to 4,000,000) or the list is not one."""
    out: list[int] = []
    for part in text.strip("[]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if not re.fullmatch(r"[0-9]{1,7}", lo) or (hi and not re.fullmatch(r"[0-9]{1,7}", hi)):
            raise JobError(f"Slurm answered the array tasks {shown(text)}, not a list of indices")
        if max(int(lo), int(hi or lo)) >= MAX_ARRAY_SIZE or len(out) + int(hi or lo) - int(lo) >= MAX_ARRAY_SIZE:
            raise JobError(f"Slurm answered the array tasks {shown(text)}: past its largest array ({MAX_ARRAY_SIZE})")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def array_tasks(job_id: str) -> list[str]:
    """The task ids (``123_0``, ``123_1``, ...) of an array job ``123``; [] when it is no array job."""
    if not re.fullmatch(r"[0-9]+", job_id):
        return []
    found = {
        i
        for rec in scontrol_records(job_id)
        if rec.get("ArrayJobId") == job_id
        for i in expand_indices(rec.get("ArrayTaskId", ""))
    }
    try:
        rows = sacct_rows("-j", job_id)
    except JobError:
        rows = []  # accounting is off or down: slurmctld's view alone
    for row in rows:
        array, sep, tasks = row.get("JobID", "").partition("_")
        if sep and array == job_id:
            found.update(expand_indices(tasks))
    return [f"{job_id}_{i}" for i in sorted(found)]


def job_state(job_id: str) -> str:
    """The job's state word: slurmctld's while it remembers the job (accounting lags behind
    it, e.g. right after a requeue), then accounting's; PENDING while neither knows it yet."""
    state = scontrol_fields(job_id).get("JobState", "")
    if not state:
        rows = sacct_rows("-j", job_id)
        state = rows[-1]["State"] if rows else ""
    return state.split(" ")[0] or "PENDING"


def script_stdout(submit_line: str, workdir: str, job_id: str, name: str) -> Optional[Path]:
    """The ``#SBATCH --output`` file of the script a submit line names (while that script exists)."""
    try:
        words = shlex.split(submit_line)
    except ValueError:
        return None
    for word in reversed(words[1:]):
        script = Path(workdir) / word
        if script.is_file():
            try:
                text = read_small_text(script, META_BYTES)
            except (OSError, ValueError):
                return None
            m = re.search(r"^#SBATCH\s+(?:--output[= ]|-o\s*)(\S+)", text, re.M)
            if not m:
                return None
            pattern = shlex.split(m.group(1))[0]
            array, _, task = job_id.partition("_")
            return Path(workdir) / (
                pattern.replace("%A", array)
                .replace("%a", task)
                .replace("%j", job_id)
                .replace("%x", name)
                .replace("%%", "%")
            )
    return None


def get_job(job_id: str) -> Job:
    """The job as Slurm sees it now; JobError when Slurm knows no such job."""
    problem = job_id_problem(job_id)
    if problem:
        raise JobError(problem)
    tasks = array_tasks(job_id)
    if tasks:
        raise JobError(
            f"job {job_id} is an array of {len(tasks)} tasks "
            f"({', '.join(tasks[:3])}{', ...' if len(tasks) > 3 else ''}): "
            "name one task, or see them all with hpc.jobs status / report"
        )
    ctl = scontrol_fields(job_id)
    try:
        rows = sacct_rows("-j", job_id)
    except JobError:
        if not ctl:
            raise
        rows = []  # accounting is off or down: slurmctld's view alone
    if not rows and not ctl:
        raise JobError(f"job {job_id} does not exist (neither squeue/scontrol nor sacct knows it)")
    return job_from(job_id, ctl, rows)


def job_from(job_id: str, ctl: dict[str, str], rows: list[dict[str, str]]) -> Job:
    """The job from slurmctld's fields (parse_scontrol; {} once it forgot the job) and its sacct runs."""
    last = rows[-1] if rows else {}
    name = ctl.get("JobName") or last.get("JobName", "")
    if ctl.get("StdOut"):
        stdout: Optional[Path] = Path(ctl["StdOut"])
    else:
        stdout = script_stdout(last.get("SubmitLine", ""), last.get("WorkDir", "/"), job_id, name)
    return Job(
        job_id=job_id,
        name=name,
        state=ctl.get("JobState") or last.get("State", "UNKNOWN"),
        nodes=count("scontrol", "NumNodes", ctl.get("NumNodes", "").split("-")[0])
        or count("sacct", "NNodes", last.get("NNodes", "")),
        elapsed=ctl.get("RunTime") or last.get("Elapsed", ""),
        partition=ctl.get("Partition") or last.get("Partition", ""),
        nodelist=ctl.get("NodeList") or last.get("NodeList", ""),
        restarts=count("scontrol", "Restarts", ctl["Restarts"]) if ctl.get("Restarts") else restarts(rows),
        stdout=stdout,
        array_task=int(job_id.partition("_")[2]) if "_" in job_id else None,
        reason=ctl.get("Reason", ""),
        excluded=ctl.get("ExcNodeList", ""),
        exit_code=ctl.get("ExitCode", ""),
    )
