"""Which job a run directory belongs to: job names map to directories one to one, and each directory records
the exact name of the job that created it, so no job resumes, trims or deletes another job's files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from hpc.node.cli import HpcError
from hpc.node.contract import OWNER_FILE
from hpc.node.files import read_json_object

_NAME_MAX = 64


class OwnershipError(HpcError):
    """The directory belongs to another job, or cannot be written; the message is one line."""


def slug(text: str, limit: int, keep: str = "") -> str:
    """``text`` as a readable file name: each run of characters other than letters, digits, ``.``, ``_``, ``-`` (and
    those in ``keep``) becomes one ``_``, leading and trailing ``.``, ``_``, ``-`` go, and it is cut to ``limit``."""
    return re.sub(f"[^A-Za-z0-9._{re.escape(keep)}-]+", "_", text).strip("._-")[:limit]


def run_dir_name(job_name: str) -> str:
    """The directory name of a job name (its job and checkpoint directories): the name itself when it is a plain file
    name (letters, digits, ``.``, ``_``, ``-``; at most 64 characters), otherwise its slug plus a hash of the exact
    name, so two names that differ in any character never share one."""
    if re.fullmatch(f"[A-Za-z0-9][A-Za-z0-9._-]{{0,{_NAME_MAX - 1}}}", job_name):
        return job_name
    return f"{slug(job_name, _NAME_MAX) or 'job'}-{hashlib.sha256(job_name.encode()).hexdigest()[:10]}"


def unnamed_owner() -> str:
    """The owner of a run started without a job name (plain torchrun): the user's own, never the empty name."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"unnamed run of {user}"


def check_owner(directory: Path, job_name: str, what: str) -> None:
    """Refuse a directory that another job already claimed (creates nothing)."""
    owner_file = Path(directory) / OWNER_FILE
    if owner_file.exists():
        _compare(directory, _read_owner(owner_file, directory, what), job_name, what)


def _read_owner(owner_file: Path, directory: Path, what: str) -> str:
    try:
        name = read_json_object(owner_file)["job_name"]
        if not isinstance(name, str):
            raise TypeError(name)
        return name
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else f"unreadable {OWNER_FILE}"
        raise OwnershipError(f"{what} {directory}: cannot use it ({reason})") from None


def _compare(directory: Path, owner: str, job_name: str, what: str) -> None:
    if owner != job_name:
        raise OwnershipError(
            f"{what} {directory} belongs to job {owner!r} (its {OWNER_FILE}); this job is {job_name!r}: "
            "pick another job name or directory"
        )


def claim(directory: Path, job_name: str, what: str) -> None:
    """Create ``directory`` if needed and make sure it belongs to ``job_name``; the first claim
    records the name (atomically: concurrent ranks of one job agree, two jobs cannot both win).
    ``what`` names the setting the directory comes from, for the message."""
    directory = Path(directory)
    owner_file = directory / OWNER_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not owner_file.exists():
            tmp = directory / f".owner.{os.getpid()}.{time.monotonic_ns()}.tmp"
            tmp.write_text(json.dumps({"job_name": job_name}) + "\n")
            try:
                os.link(tmp, owner_file)  # fails if another process recorded its owner first
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
    except OSError as e:
        raise OwnershipError(f"{what} {directory}: cannot use it ({e.strerror})") from None
    _compare(directory, _read_owner(owner_file, directory, what), job_name, what)


def unclaim(directories, job_name: str) -> None:
    """Undo `claim` on directories this run made (a later refusal): each goes again, deepest first, when it holds
    nothing but ``job_name``'s owner record; anything else there stays."""
    for directory in sorted((Path(d) for d in directories), key=lambda d: len(d.parts), reverse=True):
        owner = directory / OWNER_FILE
        try:
            if [p.name for p in directory.iterdir()] == [OWNER_FILE] and read_json_object(owner).get(
                "job_name"
            ) == job_name:
                owner.unlink()
            directory.rmdir()  # only when empty
        except (OSError, ValueError):
            pass
