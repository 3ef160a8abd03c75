"""Job chains: ``--after JOB[:ok|any|notok]`` as sbatch's ``--dependency``, each job checked to exist in Slurm."""

from __future__ import annotations

from typing import Sequence

from hpc.node.cli import HpcError, shown
from hpc.slurm_query import JobError, job_id_problem, sacct_rows, scontrol_records

KINDS = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}


class DependencyError(HpcError):
    """Bad --after input; the message is one line naming the flag."""


def parse_after(items: Sequence[str]) -> tuple[str, ...]:
    """``123``, ``123:any``, ``123_4:notok`` -> ("afterok:123", "afterany:123", "afternotok:123_4")."""
    out: list[str] = []
    for item in items:
        job, sep, kind = item.partition(":")
        kind = kind if sep else "ok"
        problem = job_id_problem(job)
        if problem:
            raise DependencyError(f"--after {shown(item)}: expected JOB[:ok|any|notok]; {problem}")
        if kind not in KINDS:
            raise DependencyError(f"--after {shown(item)}: {shown(kind)} is not one of ok, any, notok")
        dep = f"{KINDS[kind]}:{job}"
        if dep not in out:
            out.append(dep)
    return tuple(out)


def dependency_directive(after: Sequence[str]) -> str:
    """sbatch's --dependency value: every condition must hold (comma-separated)."""
    return ",".join(after)


def check_known(after: Sequence[str]) -> None:
    """Refuse a dependency on a job that neither slurmctld nor accounting knows."""
    for dep in after:
        job = dep.split(":", 1)[1]
        try:
            if scontrol_records(job):  # a job, an array job (a record per task) or one task
                continue
        except JobError as e:
            raise DependencyError(f"--after {job}: {e}") from None
        try:
            known = bool(sacct_rows("-j", job))
        except JobError:  # accounting off or down: slurmctld's view alone
            known = False
        if not known:
            raise DependencyError(f"--after {job}: no such job (neither squeue/scontrol nor sacct knows it)")
