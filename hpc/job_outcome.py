"""What `hpc.jobs status` says ended or held a job, and the next step: from Slurm's state word and reason, the
nodes the job excluded itself from, and its task logs (a rank out of GPU memory, hpc.node.launch's error line)."""

from __future__ import annotations

import re
from pathlib import Path

from hpc.node.contract import task_log
from hpc.node.files import NotASmallFile, read_range
from hpc.slurm_query import Job

LOG_TAIL_BYTES = 64 << 10  # the end of each task log is read: the error is the last thing a rank writes
GPU_OOM = re.compile(r"torch\.OutOfMemoryError|CUDA out of memory|CUDA error: out of memory")
LAUNCH_ERROR = re.compile(r"^hpc\.node\.launch: error: .*$", re.M)
RESUMES = "it resumes from its latest checkpoint"

STATE_CAUSES = {
    "TIMEOUT": (
        "it reached its time limit without stopping for a requeue (no stop signal caught, or the save took "
        "longer than the signal's lead)",
        f"resubmit with a longer --time or a larger --signal-lead; {RESUMES}",
    ),
    "NODE_FAIL": (
        "a node of the job failed (Slurm lost it)",
        f"resubmit with --exclude {{nodes}} (and --preflight to check the nodes first); {RESUMES}",
    ),
    "PREEMPTED": (
        "a higher-priority job preempted it",
        "where the partition requeues preempted jobs (PreemptMode=REQUEUE) it "
        f"comes back by itself; otherwise resubmit, {RESUMES}",
    ),
    "OUT_OF_MEMORY": (
        "a task ran out of host memory (Slurm's memory limit)",
        "lower micro_batch (e.g. -- micro_batch=1), or plan again: python -m hpc.plan",
    ),
    "BOOT_FAIL": ("a node did not boot", f"resubmit (with --exclude {{nodes}}); {RESUMES}"),
    "DEADLINE": ("it could not finish by its --deadline", "resubmit with a later deadline"),
}


def log_tails(job: Job) -> list[str]:
    """The last LOG_TAIL_BYTES of each task log of the job's directory (its batch log is task 0's)."""
    if job.job_dir is None:
        return []
    tails = []
    for path in sorted(job.job_dir.glob(task_log(Path("."), job.job_id, "*").name)):
        try:
            tails.append(read_range(path, None, LOG_TAIL_BYTES)[0].decode(errors="replace"))
        except (OSError, NotASmallFile):  # unreadable, or a FIFO or directory in a log's place
            continue
    return tails


def failed_lines(job: Job) -> list[str]:
    """A FAILED job: what its logs say (a rank out of GPU memory, a node's launch error), else its exit code."""
    tails = log_tails(job)
    if any(GPU_OOM.search(t) for t in tails):
        return [
            "cause: a rank ran out of GPU memory (CUDA out of memory in its log)",
            "next: lower micro_batch (e.g. -- micro_batch=1) or turn on activation checkpointing, or plan again: "
            "python -m hpc.plan --site SITE --nodes N --model SIZE",
        ]
    errors = [m.group(0) for t in tails for m in LAUNCH_ERROR.finditer(t)]
    if errors:
        return [f"cause: {errors[-1]}", "next: fix what the line names (the profile or the node), then resubmit"]
    code = f" (exit code {job.exit_code})" if job.exit_code else ""
    return [
        f"cause: the ranks or the batch script failed{code}",
        f"next: read the logs: python -m hpc.jobs logs {job.job_id}",
    ]


def outcome_lines(job: Job) -> list[str]:
    """``cause: ...`` and ``next: ...`` for a job that ended other than COMPLETED, or waits after a requeue; the nodes
    it excluded itself from. [] for a job running or done without trouble."""
    state = job.state.split()
    word = state[0] if state else ""
    lines = []
    if job.excluded:
        lines.append(f"excluded nodes: {job.excluded} (marked bad by the job itself, or given with --exclude)")
    if word in ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING") and job.restarts:
        why = f", waiting: {job.reason}" if word == "PENDING" and job.reason else ""
        lines.append(f"requeued {job.restarts} time(s){why}; {RESUMES}")
    elif word == "CANCELLED":
        who = f" by user id {state[2]}" if len(state) > 2 and state[1] == "by" else ""
        lines += [f"cause: cancelled{who} (scancel)", f"next: resubmit the same command; {RESUMES}"]
    elif word == "FAILED":
        lines += failed_lines(job)
    elif word in STATE_CAUSES:
        cause, step = STATE_CAUSES[word]
        nodes = job.nodelist or "NODES"
        lines += [f"cause: {cause}", f"next: {step.format(nodes=nodes)}"]
    return lines
