"""One live run per checkpoint directory: a lease file that rank 0 takes before the run writes anything.

The lease (``.lease.json`` in the checkpoint directory) records the run (a random id), its Slurm job id, host, pid
and start time; the holder refreshes its modification time every ``REFRESH_S`` seconds. Another run takes it over
only when the holder has surely ended: the same Slurm job (a requeue of it), a process of this host that no longer
exists, a job Slurm no longer lists as pending or running, or a lease not refreshed for ``STALE_S`` seconds. Creation
is atomic (a hard link that fails while any lease is there); a take-over is done under an exclusive ``flock`` of
``.lease.lock`` beside it and checks that what it moved aside is the lease it judged ended, so of many runs that
find the same ended holder exactly one takes its place.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from hpc.node.cli import HpcError, shown
from hpc.node.contract import ENDED_STATES, LEASE_FILE
from hpc.node.files import read_json_object
from hpc.node.tool import run_tool

REFRESH_S = 30.0
TAKEOVER_LOCK = ".lease.lock"  # beside the lease: serializes take-overs
STALE_S = 300.0  # ten missed refreshes: the holder is gone even where Slurm cannot be asked (inside a container)
LEASE_BYTES = 64 << 10  # a lease record is about 200 bytes


class LeaseHeld(HpcError):
    """Another live run holds the directory (bad input: exit 2, nothing written)."""


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """This process's Slurm job id as Slurm's clients take it (array tasks: ARRAYJOB_TASK); None outside Slurm."""
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID") or None


def _slurm_state(job_id: str) -> str | None:
    """The job's state as squeue shows it; "" when Slurm no longer lists it; None when Slurm cannot be asked."""
    try:
        r = run_tool(["squeue", "-h", "-j", job_id, "-o", "%T"], 15)
    except OSError:
        return None
    if r.returncode != 0:
        return "" if "Invalid job id" in r.stderr else None
    return r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Lease:
    """The lease this run holds on ``directory`` (rank 0); ``release`` at the end."""

    directory: Path
    record: dict
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def path(self) -> Path:
        return self.directory / LEASE_FILE

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    def refresh_in_background(self) -> None:
        def loop() -> None:
            while not self._stop.wait(REFRESH_S):
                try:
                    os.utime(self.path)
                except OSError:
                    pass

        threading.Thread(target=loop, name="lease-refresh", daemon=True).start()

    def release(self) -> None:
        """Stop refreshing and remove the lease if it is still this run's."""
        self._stop.set()
        try:
            if read_json_object(self.path, LEASE_BYTES).get("run_id") == self.run_id:
                self.path.unlink()
        except (OSError, ValueError):
            pass


class NotALease(HpcError):
    """The file where the lease belongs is not a lease this project writes (bad input: exit 2, nothing written)."""


EARLIEST_START = 946684800.0  # 2000-01-01: a lease "started" before it was written by no run of this project
CLOCK_SKEW_S = 86400.0  # a start this far ahead of this host's clock (another host's) is still believed


def _record_problem(record: dict) -> str | None:
    """What makes a JSON object not a lease record (`take` writes run_id, job_id, job_name, host, pid, started)."""

    def text(key: str, optional: bool = False) -> bool:
        value = record.get(key)
        return isinstance(value, str) and (value != "" or key == "job_name") or optional and value is None

    for key, optional in (("run_id", False), ("job_id", True), ("job_name", False), ("host", False)):
        if key not in record or not text(key, optional):
            what = "missing" if key not in record else shown(record[key])
            return f"{key} is {what}, not a {'job id or null' if optional else 'string'}"
    pid, started = record.get("pid"), record.get("started")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
        return f"pid is {'missing' if 'pid' not in record else shown(pid)}, not a process id"
    if (
        isinstance(started, bool)
        or not isinstance(started, (int, float))
        or not EARLIEST_START <= started <= time.time() + CLOCK_SKEW_S
    ):  # nan fails both
        return f"started is {'missing' if 'started' not in record else shown(started)}, not a time since 2000"
    return None


def _holder(path: Path, directory: Path, what: str) -> tuple[dict, float] | None:
    """The lease's record and age in seconds; None when there is no lease; NotALease when the file there is not one."""
    try:
        age = time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return None

    def garbage(reason: str) -> NotALease:
        return NotALease(
            f"{what} {directory}: its {LEASE_FILE} is not a lease ({reason}); no live run holds the directory "
            f"through it: if no run uses {directory}, remove {path} and start again"
        )

    try:
        record = read_json_object(path, LEASE_BYTES)
    except FileNotFoundError:
        if path.is_symlink():
            raise garbage("a symbolic link to a missing file") from None
        return None  # released meanwhile
    except (OSError, ValueError) as e:
        reason = (
            e.strerror
            if isinstance(e, OSError) and e.strerror
            else str(e).replace(f"{path} ", "it ").replace(f"{path}: ", "")
        )
        raise garbage(
            reason if not isinstance(e, json.JSONDecodeError) else f"not JSON: {e.msg} at character {e.pos}"
        ) from None
    problem = _record_problem(record)
    if problem:
        raise garbage(problem)
    return record, age


def _ended(holder: dict, age: float, me: dict) -> str | None:
    """Why the holder has surely ended, or None while it may be alive."""
    job = holder.get("job_id")
    if job and job == me["job_id"]:
        return f"the same Slurm job {job} (requeued)"
    if (
        holder.get("host") == me["host"]
        and isinstance(holder.get("pid"), int)
        and not job
        and not _pid_alive(holder["pid"])
    ):
        return f"process {holder['pid']} on {me['host']} has exited"
    if job:
        state = _slurm_state(str(job))
        if state == "" or state in ENDED_STATES:
            return f"Slurm job {job} has ended{f' ({state})' if state else ''}"
    if age > STALE_S:
        return f"not refreshed for {age:.0f} s"
    return None


def describe(holder: dict) -> str:
    job = f"Slurm job {holder['job_id']}" if holder.get("job_id") else "a run"
    return (
        f"{job} {holder.get('job_name') or ''!r} on {holder.get('host', '?')} (pid {holder.get('pid', '?')}, "
        f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.get('started', 0)))})"
    )


def _judge(path: Path, me: dict, directory: Path, what: str) -> tuple[dict | None, str | None]:
    """The holder's record and why it has surely ended ((None, None) when there is no lease); LeaseHeld while it
    lives."""
    holder = _holder(path, directory, what)
    if holder is None:
        return None, None
    why = _ended(*holder, me)
    if why is None:
        raise LeaseHeld(
            f"{what} {directory} is in use by {describe(holder[0])} (its {LEASE_FILE}); one live run per "
            "checkpoint directory: wait for it to end, cancel it, or use another checkpoint.dir"
        )
    return holder[0], why


@contextlib.contextmanager
def _takeover_lock(directory: Path):
    """Exclusive ``flock`` on ``directory/.lease.lock`` (released when the process dies); where the file system has no
    locks, nothing: the check after the move aside still refuses to replace a lease this run did not judge."""
    fd = os.open(directory / TAKEOVER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _replace(directory: Path, path: Path, tmp: Path, me: dict, judged: dict, what: str) -> bool:
    """Under the take-over lock: move the ended holder's lease aside and link this run's; False when the lease there is
    no longer the one judged (look again)."""
    now = _holder(path, directory, what)
    if now is None or now[0] != judged:
        return False
    aside = directory / f".lease.{me['run_id']}.ended"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        moved = read_json_object(aside, LEASE_BYTES)
    except (OSError, ValueError):
        moved = {}
    if moved != judged:  # the holder released it and another run linked its own meanwhile: put that one back
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
        aside.unlink()
        return False
    aside.unlink()
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    return True


def take(
    directory: Path, job_name: str, environ: Mapping[str, str], what: str = "checkpoint.dir"
) -> tuple[Lease, str | None]:
    """Take the lease on ``directory`` (which must exist), or raise LeaseHeld naming the live holder.
    Returns the lease and, when it was taken over, why the previous holder counts as ended."""
    directory = Path(directory)
    me = {
        "run_id": uuid.uuid4().hex[:12],
        "job_id": slurm_job_id(environ),
        "job_name": job_name,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
    }
    path = directory / LEASE_FILE
    tmp = directory / f".lease.{me['run_id']}.tmp"
    try:
        _judge(
            path, me, directory, what
        )  # a live holder or a file that is no lease: refused before anything is written
        tmp.write_text(json.dumps(me) + "\n")
        for _ in range(3):
            try:
                os.link(tmp, path)  # fails while any lease is there
                return Lease(directory, me), None
            except FileExistsError:
                pass
            with _takeover_lock(directory):
                holder, why = _judge(path, me, directory, what)
                if holder is not None and _replace(directory, path, tmp, me, holder, what):
                    return Lease(directory, me), why
    except OSError as e:
        raise HpcError(f"{what} {directory}: cannot take its lease ({e.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)
    raise LeaseHeld(
        f"{what} {directory}: its {LEASE_FILE} changed hands while this run tried to take it; another run "
        "is starting there"
    )
