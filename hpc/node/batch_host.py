"""The batch host's node failing in a job with spare nodes: requeued from another node of the job.

A job with spare nodes runs with ``--no-kill``, and Slurm (22.05) then takes a failed batch host out of the job like
any other node: it kills the batch script (and with it `hpc.node.restart`) and every step on that node, the ranks'
among them, and the job ends FAILED, never requeued, whatever ``--requeue`` says. So `hpc.node.restart` keeps this
program running as a one-task step on another node of the job:

    srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap python -m hpc.node.batch_host

It waits for SIGTERM (the job ending, or its step ended by the supervisor), then asks Slurm whether the batch host
left the job (`lost_batch_host`) and, when it did, requeues the job (``scontrol requeue`` takes a job that is still
completing), so its next run resumes from the newest complete checkpoint. Any other end (done, cancelled, a time
limit, a requeue of the batch script's) leaves the batch host in the job: nothing is done.

Slurm 24.11 takes the failed batch host out of the job the same way but does not end the job: the batch script's end
comes back as a step's, which slurmctld refuses (``_step_partial_comp: batch step received ... This should never
happen``), and the job runs on without its batch script until its time limit, so no SIGTERM comes. The watch therefore
also asks Slurm every ``POLL_S`` seconds while it waits, and requeues the job as soon as the batch host has left it.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Callable, Mapping, Optional

from hpc.node.contract import prestop_signal
from hpc.node.slurm_env import RankError, node_hosts, node_name
from hpc.node.tool import run_tool

SCONTROL_TIMEOUT_S = 10.0
POLL_S = 10.0  # between two looks at the job while no SIGTERM has come


def lost_batch_host(show_job: str) -> Optional[str]:
    """The batch host named by ``scontrol show job -o``'s line ``show_job`` when the job no longer holds its node and
    may be requeued (``Requeue=1``); None otherwise."""
    fields = dict(re.findall(r"(?:^|\s)(BatchHost|NodeList|Requeue)=(\S*)", show_job))
    host = fields.get("BatchHost", "")
    if fields.get("Requeue") != "1" or not host or host == "(null)":
        return None
    try:
        nodes = node_hosts(fields.get("NodeList", ""))
    except RankError:  # "(null)" or empty: no node left
        nodes = []
    return None if host in nodes else host


def requeue_if_batch_host_lost(environ: Mapping[str, str], who: str, run: Callable = run_tool) -> Optional[str]:
    """Requeue the job when its batch host left it; the batch host then, else None (nothing done)."""
    job = environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    try:
        host = lost_batch_host(run(["scontrol", "show", "job", "-o", job], SCONTROL_TIMEOUT_S).stdout)
        if host is None:
            return None
        print(
            f"[batch host] {who}: the batch host {host} left job {job} (its node failed: under --no-kill Slurm ends "
            "the job without a requeue, 24.11 runs it on without its batch script); requeueing it",
            flush=True,
        )
        r = run(["scontrol", "requeue", job], SCONTROL_TIMEOUT_S)
    except OSError as e:  # scontrol missing or not answering
        print(f"[batch host] {who}: could not ask Slurm about job {job}'s batch host: {e}", flush=True)
        return None
    if r.returncode != 0:
        print(f"[batch host] {who}: scontrol requeue {job} failed: {(r.stdout + r.stderr).strip()}", flush=True)
    return host


def watch(
    environ: Mapping[str, str], who: str, wait: Callable[[float], bool], run: Callable = run_tool
) -> Optional[str]:
    """Until ``wait(POLL_S)`` says SIGTERM came (True), look at the job every ``POLL_S`` seconds and requeue it once
    its batch host left it; after SIGTERM look once more. The lost batch host, else None (nothing done)."""
    while not wait(POLL_S):
        host = requeue_if_batch_host_lost(environ, who, run)
        if host is not None:
            return host
    return requeue_if_batch_host_lost(environ, who, run)


def main() -> None:
    if prestop_signal(os.environ) != signal.SIGTERM:  # the time limit's notice is the ranks'
        signal.signal(prestop_signal(os.environ), signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    watch(os.environ, f"the watch on {node_name()}", lambda s: signal.sigtimedwait({signal.SIGTERM}, s) is not None)


if __name__ == "__main__":
    main()
