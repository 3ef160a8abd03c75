"""Submit a rendered job through submitit and follow it until it ends: the one way every command submits.

What a submission does besides validation lives here and runs only when a script leaves the dry run (emitted,
tested or submitted): Slurm's clients pointed at the profile's slurm.conf, the --after jobs looked up, and, for a
submission, the check for a live job of the same name and the claim of the job's directories.

submitit submits the text of `render_sbatch` unchanged (the dry run is the submission) and
returns its job object; the job's state is read from slurmctld first (at once) and from
accounting once slurmctld forgets the job.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import submitit

from hpc.dependency import check_known
from hpc.node.cli import shown
from hpc.node.contract import ENDED_STATES, FINAL_STATES, task_log
from hpc.node.files import NotASmallFile, read_range
from hpc.node.ownership import claim
from hpc.node.tool import run_tool
from hpc.render import render_sbatch
from hpc.slurm_query import JobError, check_controller, job_state, squeue_rows
from hpc.slurm_version import check_version, sbatch_version
from hpc.spec import JobSpec, SpecError
from hpc.sweep import write_table

SBATCH_TIMEOUT_S = 60  # sbatch --test-only asks slurmctld
FOLLOW_BYTES = 1 << 20  # of the log followed, what one look shows


def use_site_slurm(spec: JobSpec) -> None:
    """Point Slurm's clients at the profile's slurm.conf (unless SLURM_CONF is set), check that sbatch is reachable,
    slurmctld answers and its version takes the profile's options, and that Slurm knows every --after job."""
    conf = spec.site.submission.slurm_conf
    if conf and "SLURM_CONF" not in os.environ:
        if not Path(conf).is_file():
            raise SpecError(f"site {spec.site.name}: submission.slurm_conf {conf} does not exist")
        os.environ["SLURM_CONF"] = conf
    if shutil.which("sbatch") is None:
        raise SpecError(
            "sbatch is not on PATH: submit from a Slurm login node (or start the local cluster: scripts/cluster.sh up)"
        )
    check_controller()
    check_version(spec, sbatch_version())
    check_known(spec.after)


def check_after(spec: JobSpec) -> None:
    """Before a script is written for a later sbatch: Slurm knows every --after job (Slurm is asked only for those)."""
    if spec.after:
        use_site_slurm(spec)


def prepare_submission(spec: JobSpec) -> None:
    """Before sbatch: Slurm's side (`use_site_slurm`), no job of this name queued or running, and the job and
    checkpoint directories (each array task's for that task) claimed for this job name."""
    use_site_slurm(spec)
    live = [
        r
        for r in squeue_rows("-u", getpass.getuser())
        if r["JobName"] == spec.job_name and r["State"] not in FINAL_STATES | {"COMPLETING"}
    ]
    if live:
        raise SpecError(
            f"--job-name {shown(spec.job_name)}: job {live[0]['JobIDRaw']} of that name is {live[0]['State']}; two "
            "jobs of one "
            "name would share one run: wait for it, cancel it, or pick another name"
        )
    claim(spec.job_dir, spec.job_name, "job directory")
    if spec.runs_trainer:
        claim(spec.checkpoint_dir, spec.job_name, "checkpoint directory")
    if spec.sweep is not None:
        write_table(spec.sweep, spec.job_name, spec.job_dir)
        for t in spec.sweep.tasks:
            claim(spec.job_dir / t.dir_name, t.owner(spec.job_name), f"task {t.index}'s log.dir")
            claim(spec.checkpoint_dir / t.dir_name, t.owner(spec.job_name), f"task {t.index}'s checkpoint.dir")


class RenderedExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor, submitting one ready sbatch text instead of a pickled function.

    submitit has no public call for a ready script: this overrides its private ``_make_submission_file_text``
    and calls its private ``_submit_command``, so pyproject.toml pins submitit to the versions tested
    (tests/unit/test_submitit_api.py fails when an installed submitit lacks them)."""

    def __init__(self, folder: Path, text: str):
        super().__init__(folder=folder)
        self._text = text

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._text

    def submit_text(self) -> submitit.SlurmJob:
        return self._submit_command("")


def submit(spec: JobSpec) -> submitit.SlurmJob:
    """Submit the job's script; raises SpecError with sbatch's own message when Slurm refuses it."""
    prepare_submission(spec)
    executor = RenderedExecutor(spec.job_dir, render_sbatch(spec))
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):  # submitit echoes sbatch's stderr; it goes into our one line
            return executor.submit_text()
    except submitit.core.utils.FailedJobError as e:
        message = " ".join(str(e).split()) or captured.getvalue().strip() or "no message"
        extra = spec.site.submission.extra_sbatch
        added = ", ".join(f"--{k}" + ("" if v is True else f"={v}") for k, v in extra.items())
        hint = f" (the profile's submission.extra_sbatch adds {added})" if extra else ""
        raise SpecError(f"sbatch refused the job: {message}{hint}") from None
    except submitit.core.utils.FailedSubmissionError as e:  # sbatch exited 0 but printed no "job <id>"
        raise SpecError(f"sbatch printed no job id: {' '.join(str(e).splitlines()[0].split())}") from None


def test_only(spec: JobSpec) -> str:
    """``sbatch --test-only`` on the rendered script: Slurm's line on where and when the job would start
    (nothing is submitted); SpecError with sbatch's message when Slurm refuses it."""
    use_site_slurm(spec)
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch") as f:
        f.write(render_sbatch(spec))
        f.flush()
        try:
            r = run_tool(["sbatch", "--test-only", f.name], SBATCH_TIMEOUT_S, cwd=spec.workdir)
        except OSError as e:
            raise SpecError(f"sbatch --test-only: {e}") from None
    message = " ".join(r.stderr.split()).removeprefix("sbatch: ")
    if r.returncode != 0:
        raise SpecError(f"sbatch --test-only refused the job: {message.removeprefix('error: ') or 'no message'}")
    return message


def follow(
    job_id: str,
    log: Path,
    poll_s: float = 1.0,
    prefix: str = "[wait]",
    deadline: Optional[Callable[[str, float], bool]] = None,
) -> str:
    """Print state changes and ``log``'s new text until the job ends; returns the final state.

    ``deadline(state, started_at)`` may end the following early (returns the state then)."""
    shown, state, started = 0, None, None
    while True:
        try:
            new = job_state(job_id)
        except JobError as e:
            print(f"{prefix} job {job_id}: {e}", file=sys.stderr, flush=True)
            new = state or "UNKNOWN"
        if new != state:
            state = new
            print(f"{prefix} job {job_id}: {state}", flush=True)
        if started is None and state not in ("PENDING", "REQUEUED"):
            started = time.time()
        try:
            chunk = read_range(log, shown, FOLLOW_BYTES)[0]
        except (OSError, NotASmallFile):  # not there yet (or not a regular file: nothing to show)
            chunk = b""
        if chunk:
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
            shown += len(chunk)
        if state in ENDED_STATES or (deadline is not None and deadline(state, started)):
            return state
        time.sleep(poll_s)


def first_log(spec: JobSpec, job_id: str) -> Path:
    """Task 0's log, which the batch script's own output shares."""
    return task_log(spec.job_dir, job_id, 0)
