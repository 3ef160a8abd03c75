"""python -m hpc.node.restart: the batch script of a job with spare nodes runs its ranks through this instead of one
srun: on N of the allocation's N + K nodes, and again within the job when they fail in a way that names a node (a
spare taking the bad node's place), each start resuming from the newest complete checkpoint; no requeue, no queue.

    python -m hpc.node.restart --nodes N --tasks-per-node T --ranks R --marks DIR [--max-restarts M]
        [--max-restarts-per-node P] [--gpus-per-node G] -- srun [OPTIONS] PROGRAM [ARGS]

Each start of the ranks (an attempt) is ``srun --nodes=N --ntasks=N*T --nodelist=NODES OPTIONS PROGRAM ARGS`` with
``HPC_ATTEMPT``, ``HPC_ATTEMPT_DIR`` and its own bad-node marks (``HPC_BAD_NODE_MARKS``) set; its tasks and ranks leave
their records there (`hpc.node.attempt`). As soon as the records say what ended the attempt, its remaining ranks are
killed (``scancel --signal=KILL JOB.STEP``) and `hpc.node.restart_policy` decides: restart, done, or leave it to the
batch script (requeue, or end). A rank's suspected node fault (exit 94, `hpc.node.fault_table`) first has its node's
GPUs checked (``srun --nodelist=NODE python -m hpc.node.health --gpus G``): the policy blames the node only when they
fail. Nodes that failed the health stage (marked in DIR before) are left out from the start.
Every decision is a line on the output (``[restart] ...``) and a record in ``<job dir>/restarts.jsonl``, completed
with the time the restarted ranks trained again.

Exit code: 0 when the ranks are done or stopped with a checkpoint (their stop record tells the batch script to
requeue), else that of the failure; DIR then names the nodes a requeue must exclude, and is empty when the job must
end (the batch script's own rules, unchanged).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from hpc.node import attempt as records
from hpc.node.cli import HpcError, Parser, fail, path_text, shown, whole
from hpc.node.contract import (
    ATTEMPT_DIR,
    ATTEMPT_DIR_VAR,
    ATTEMPT_VAR,
    BAD_NODE_MARKS_VAR,
    BATCH_HOST_MODULE,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MAX_RESTARTS_PER_NODE,
    EXIT_STOPPED,
    HEALTH_MODULE,
    JOB_DIR_VAR,
    LAUNCH_MODULE,
    MAX_COUNT,
    MAX_GPUS_PER_NODE,
    PROJECT_MODULE,
    RESTART_DIR,
    RESTART_LOG,
    RESTART_MODULE,
    STANDBY_MODULE,
    STANDBY_VAR,
    STOP_RECORD_VAR,
    TRAINER_MODULE,
)
from hpc.node.files import NotASmallFile, read_range, regular_file_problem
from hpc.node.hang import GRACE_S, STORE_TIMEOUT_S
from hpc.node.hang_deadlines import hung, late
from hpc.node.launch import parser as launch_parser
from hpc.node.launcher import SRUN
from hpc.node.lease import slurm_job_id
from hpc.node.restart_policy import (
    Action,
    Decision,
    Failure,
    History,
    Kind,
    Limits,
    decide,
    decisive,
    judge,
    left_the_job,
    place,
)
from hpc.node.slurm_env import node_hosts, node_name
from hpc.node.tool import ToolMissing, ToolTimeout, run_tool

PROG = RESTART_MODULE
MAX_JOB_ID = 2**32 - 1
LOG_BYTES = 16 << 20  # of restarts.jsonl, its newest records (a few hundred bytes each)
TERM_WAIT_S = 20.0  # after SIGTERM, how long the ranks' srun has to end before it is killed (Slurm's KillWait: 30 s)
RECORD_FIELDS = {
    "restart": int,
    "attempt": int,
    "number": int,
    "step": int,
    "resumed_step": int,
    "action": str,
    "kind": str,
    "what": str,
    "why": str,
    **{k: (int, float) for k in ("fault_at", "seen_at", "ended_at", "load_started_at", "loaded_at", "trained_at")},
    "nodes": list,
}
POLL_S = 0.25
EVIDENCE_S = GRACE_S + STORE_TIMEOUT_S + 2.0  # after a first failure record, the longest wait for the others' records
SLURM_TIMEOUT_S = 30.0  # squeue and scancel from the batch script
END_WAIT_S = 60.0  # how long srun may take to return once its tasks were killed
WATCH_LOG = "batch-host-watch-%t.out"  # what hpc.node.batch_host said; %t: written on its node, not by srun
STANDBY_LOG = "standby-%N.out"  # what each node's hpc.node.standby said
NODE_CHECK_S = 180.0  # a node's GPU checks after a suspected node fault: not done within this, the node failed them


def job_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The job's values this needs from the batch script's environment, checked as hpc.node.launch checks them; an
    HpcError naming a missing or malformed one."""
    needed = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", JOB_DIR_VAR, STOP_RECORD_VAR)
    missing = [n for n in needed if not environ.get(n)]
    if missing:
        raise HpcError(
            f"missing {', '.join(missing)}: run this in the batch script of a job (python -m hpc.submit "
            "--spare-nodes renders it)"
        )
    env = {n: environ[n] for n in needed} | {"SLURM_RESTART_COUNT": environ.get("SLURM_RESTART_COUNT", "0")}
    job_id = env["SLURM_JOB_ID"]
    if not re.fullmatch(r"[0-9]{1,10}", job_id) or not 1 <= int(job_id) <= MAX_JOB_ID:
        raise HpcError(f"SLURM_JOB_ID={shown(job_id)} is not a Slurm job id (1 to {MAX_JOB_ID})")
    if not re.fullmatch(r"[0-9]{1,6}", env["SLURM_RESTART_COUNT"]):
        raise HpcError(f"SLURM_RESTART_COUNT={shown(env['SLURM_RESTART_COUNT'])} is not a whole number")
    return env


def check_places(job_dir: Path, marks: Path, stop_record: Path) -> None:
    """The job directory is one, the marks are a directory (or not there yet, in one) and the stop record's directory
    exists: checked before anything is made or started."""
    if not job_dir.is_dir():
        raise HpcError(f"{JOB_DIR_VAR}={shown(str(job_dir))} is not a directory (hpc.submit makes the job's)")
    if marks.exists() and not marks.is_dir():
        raise HpcError(f"--marks {shown(str(marks))} is {regular_file_problem(marks) or 'a file'}, not a directory")
    if not marks.exists() and not marks.parent.is_dir():
        raise HpcError(f"--marks {shown(str(marks))}: {marks.parent} is not a directory")
    if not stop_record.parent.is_dir():
        raise HpcError(f"{STOP_RECORD_VAR}={shown(str(stop_record))}: {stop_record.parent} is not a directory")
    log = job_dir / RESTART_LOG
    problem = regular_file_problem(log)
    if problem:
        raise HpcError(f"{log} is {problem}, not the job's restart records")


def standby_preload(command: Sequence[str]) -> list[str]:
    """What a node's standby imports for the ranks of ``command`` (srun ... hpc.node.launch ... -- RANK PROGRAM): torch
    and transformers, and the trainer for the project's; none where launch does not start the ranks itself (a
    container's runtime, torchrun or accelerate start them). Launch's options are read with its own parser."""
    if LAUNCH_MODULE not in command:
        return []
    task = launch_parser().parse_args(command[command.index(LAUNCH_MODULE) + 1 :])
    if task.container or task.launcher != SRUN.name:
        return []
    rank = task.command[1:] if task.command[:1] == ["--"] else task.command
    trainer = PROJECT_MODULE in rank and rank[rank.index(PROJECT_MODULE) + 1 :][:1] == [TRAINER_MODULE]
    return ["torch", "transformers", *(["train.loop"] if trainer else [])]


def overlap_step(
    nodes: Sequence[str], module: Sequence[str], output: Optional[Path] = None, kill_on_bad_exit: bool = True
) -> list[str]:
    """``srun`` of one task per node of ``nodes`` beside the ranks' step (``--overlap``): this interpreter running
    ``python -u -m MODULE ARGS`` (``module``), its output appended to ``output`` (``%t``: each task's own file)."""
    return [
        "srun",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--overlap",
        *([] if kill_on_bad_exit else ["--kill-on-bad-exit=0"]),
        *([] if output is None else ["--open-mode=append", f"--output={output}"]),
        sys.executable,
        "-u",
        "-m",
        *module,
    ]


def read_log(path: Path, job_id: str) -> list[dict]:
    """This job's decision records of ``restarts.jsonl`` (all its runs), completions merged into their decision; read
    to a bound (its last LOG_BYTES), as a regular file, leniently decoded; a line that is not a record is skipped."""
    try:
        data, _ = read_range(path, None, LOG_BYTES)
    except (OSError, NotASmallFile):
        return []
    by_id: dict[str, dict] = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and rec.get("job_id") == job_id and isinstance(rec.get("id"), str):
            by_id.setdefault(rec["id"], {}).update(rec)
    return [rec for rec in by_id.values() if record_problem(rec) is None]


def record_problem(rec: dict) -> Optional[str]:
    """Why a decision record cannot be shown or counted (a field of the wrong type), None when it can."""
    for key, kinds in RECORD_FIELDS.items():
        if key in rec and rec[key] is not None and (isinstance(rec[key], bool) or not isinstance(rec[key], kinds)):
            return f"{key} is not {kinds}"
    if not all(isinstance(n, str) for n in rec.get("nodes") or []):
        return "nodes is not a list of names"
    if not isinstance(rec.get("replaced") or {}, dict):
        return "replaced is not a mapping"
    return None


def append_log(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def restart_lines(decisions: list[dict]) -> list[str]:
    """Each in-job decision of a job (`read_log`), as ``hpc.jobs status`` and ``report`` show it: what failed, which
    node a spare replaced, and the time and steps lost until the ranks trained again; or why it was not restarted."""
    lines = []
    for rec in sorted(decisions, key=lambda r: (r.get("restart", 0), r.get("attempt", 0))):
        where = f"run {rec.get('restart', 0)} attempt {rec.get('attempt', 0)}"
        if rec.get("action") != Action.RESTART:
            lines.append(f"{where}: {rec.get('what')}: {rec.get('why')}")
            continue
        replaced = rec.get("replaced") or {}
        nodes = (
            ", ".join(f"{old} replaced by {new}" for old, new in replaced.items())
            if replaced
            else "on the same nodes"
            if "next_nodes" in rec
            else ""
        )
        done = timing_line(rec) if rec.get("trained_at") else "not training again (yet)"
        lines.append(
            f"restart {rec.get('number', '?')} ({where}): {rec.get('what')}; {nodes + '; ' if nodes else ''}{done}"
        )
    return lines


def timing_line(rec: dict) -> str:
    """How long a restart took to train again, split (from a completed record)."""
    parts = []
    for name, a, b in (
        ("detection", "fault_at", "seen_at"),
        ("teardown", "seen_at", "ended_at"),
        ("restart", "ended_at", "load_started_at"),
        ("load", "load_started_at", "loaded_at"),
        ("first step", "loaded_at", "trained_at"),
    ):
        if rec.get(a) is not None and rec.get(b) is not None:
            parts.append(f"{name} {rec[b] - rec[a]:.1f} s")
    lost = (
        rec["step"] - rec["resumed_step"]
        if rec.get("step") is not None and rec.get("resumed_step") is not None
        else None
    )
    head = f"training again from step {rec.get('resumed_step')}"
    if lost is not None:
        head += f" ({lost} step(s) lost)"
    total = rec["trained_at"] - rec["fault_at"] if rec.get("fault_at") is not None else None
    return (
        head
        + (f", {total:.1f} s after the failure" if total is not None else "")
        + (f" ({', '.join(parts)})" if parts else "")
    )


class Supervisor:
    def __init__(self, a: argparse.Namespace, command: list[str], environ: Mapping[str, str]):
        self.env = job_env(environ)
        self.environ = dict(environ)
        self.nodes, self.tasks_per_node, self.ranks = a.nodes, a.tasks_per_node, a.ranks
        self.marks = Path(a.marks)
        self.limits = Limits(a.max_restarts, a.max_restarts_per_node)
        self.gpus_per_node = a.gpus_per_node
        self.command = command
        self.job = self.env["SLURM_JOB_ID"]  # this job's own id (an array task's too): its steps, its directories
        self.job_ref = slurm_job_id(environ) or self.job  # as Slurm's clients and hpc.jobs name it (ARRAY_TASK)
        self.allocation = node_hosts(self.env["SLURM_JOB_NODELIST"])
        if self.ranks != self.nodes * self.tasks_per_node:
            raise HpcError(
                f"--ranks {self.ranks}: the ranks run {self.tasks_per_node} per node on {self.nodes} node(s), "
                f"{self.nodes * self.tasks_per_node} in all"
            )
        if self.nodes > len(self.allocation):
            raise HpcError(
                f"--nodes {self.nodes}: the job holds {len(self.allocation)} node(s) (SLURM_JOB_NODELIST="
                f"{shown(self.env['SLURM_JOB_NODELIST'])})"
            )
        job_dir = Path(self.env[JOB_DIR_VAR])
        self.log = job_dir / RESTART_LOG
        self.root = job_dir / RESTART_DIR.format(job_id=self.job, restart=self.env["SLURM_RESTART_COUNT"])
        self.stop_record = Path(self.env[STOP_RECORD_VAR])
        check_places(job_dir, self.marks, self.stop_record)
        self.out: set[str] = set()
        self.ending = False
        self.proc: Optional[subprocess.Popen] = None
        self.term_at = 0.0
        self.watch: Optional[subprocess.Popen] = None  # hpc.node.batch_host's step
        self.standby: Optional[subprocess.Popen] = None  # hpc.node.standby's step
        self.preload = standby_preload(command) if self.environ.get(STANDBY_VAR) != "0" else []  # 0: none

    def _on_term(self, signum, frame) -> None:
        """SIGTERM (the job is being cancelled or requeued): the ranks' srun gets it too (they stop with a checkpoint
        and exit 75); no new start after this, and srun is killed if it is not done within TERM_WAIT_S."""
        if not self.ending:
            self.ending, self.term_at = True, time.monotonic()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        try:
            return self._run()
        finally:
            if self.watch is not None and self.watch.poll() is None:
                self.watch.terminate()  # srun passes SIGTERM on: the watch sees the batch host in the job and ends
            if self.standby is not None and self.standby.poll() is None:
                self.standby.terminate()  # each node's standby removes the run's memory snapshots there, then ends
                try:
                    self.standby.wait(timeout=END_WAIT_S)
                except subprocess.TimeoutExpired:
                    self.standby.kill()

    def _run(self) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        unhealthy = sorted(p.name for p in self.marks.iterdir()) if self.marks.is_dir() else []
        for name in unhealthy:  # the health stage's marks: this run leaves them out, and owns the directory now
            (self.marks / name).unlink()
        self.out |= set(unhealthy) & set(self.allocation)
        if unhealthy:
            print(
                f"[restart] {', '.join(unhealthy)} failed the health check: left out of job {self.job_ref}", flush=True
            )
        previous: list[str] = []
        avoid: set[str] = set()
        pending: Optional[dict] = None  # the last restart's record, completed once the ranks train again
        attempt, rc = 0, 1
        while True:
            history = History.of(read_log(self.log, self.job_ref))
            chosen = place(self.allocation, previous, self.out, avoid, history.caused, self.nodes)
            if chosen is None:
                print(
                    f"[restart] {len(set(self.allocation) - self.out)} healthy node(s) left in job {self.job_ref}, the "
                    f"ranks need {self.nodes}: back to the batch script",
                    flush=True,
                )
                self._leave_marks(self.out)
                return rc
            if pending is not None:
                pending.update(
                    next_nodes=chosen,
                    relaunched_at=time.time(),
                    replaced={
                        old: new
                        for old, new in zip(
                            sorted(set(previous) - set(chosen)), sorted(set(chosen) - set(previous)), strict=False
                        )
                    },
                )
                append_log(
                    self.log, {k: pending[k] for k in ("id", "job_id", "next_nodes", "replaced", "relaunched_at")}
                )
            self._watch_batch_host()
            if self.standby is not None and self.standby.poll() is not None:  # its step ended (a node left): again
                self._start_standby()
            rec, failure, decision = self._attempt(attempt, chosen, history, pending)
            rc = failure.rc
            pending = None
            if self.ending and decision.action != Action.DONE:  # SIGTERM: the job is cancelled or requeued now
                self._leave_marks(self.out | (set(failure.nodes) if decision.action != Action.END else set()))
                print(f"[restart] got SIGTERM: ranks stopped, job {self.job_ref} ends here (exit {EXIT_STOPPED})")
                return EXIT_STOPPED
            if decision.action == Action.DONE:
                return 0
            if decision.action == Action.STOP:
                self._leave_marks(self.out)
                return 0
            if decision.action == Action.END:
                self._leave_marks(set())
                return rc or 1
            self.out |= set(decision.out)
            if decision.action == Action.REQUEUE or self.ending:
                self._leave_marks(self.out | set(failure.nodes))
                return rc
            self.stop_record.unlink(missing_ok=True)  # a persistent straggler's stop: this run goes on
            previous, avoid, pending = chosen, set(failure.nodes), rec
            attempt += 1

    def _leave_marks(self, nodes: set[str]) -> None:
        """DIR as the batch script reads it: the nodes a requeue must exclude (none: the job ends if it failed)."""
        self.marks.mkdir(parents=True, exist_ok=True)
        for p in self.marks.iterdir():
            p.unlink()
        for node in sorted(nodes):
            (self.marks / node).touch()

    def _attempt(
        self, attempt: int, nodes: list[str], history: History, pending: Optional[dict]
    ) -> tuple[dict, Failure, Decision]:
        """One start of the ranks on ``nodes`` until they end (or are ended); the decision, logged."""
        directory = self.root / ATTEMPT_DIR.format(attempt=attempt)
        (directory / records.MARKS).mkdir(parents=True, exist_ok=True)
        srun, options = self.command[0], self.command[1:]
        argv = [
            srun,
            f"--nodes={self.nodes}",
            f"--ntasks={self.nodes * self.tasks_per_node}",
            f"--nodelist={','.join(nodes)}",
            *options,
        ]
        env = {
            **self.environ,
            ATTEMPT_VAR: str(attempt),
            ATTEMPT_DIR_VAR: str(directory),
            BAD_NODE_MARKS_VAR: str(directory / records.MARKS),
            STANDBY_VAR: "1" if self.standby is not None else "",
        }
        spares = [n for n in self.allocation if n not in nodes and n not in self.out]
        print(
            f"[restart] attempt {attempt} of job {self.job_ref}: ranks on {','.join(nodes)}; spare(s) "
            f"{','.join(spares) or 'none'}",
            flush=True,
        )
        proc = self.proc = subprocess.Popen(argv, env=env)
        first_failure = decided_at = silence = None
        snapshot = None
        said_late = False
        while proc.poll() is None:
            time.sleep(POLL_S)
            if self.ending and time.monotonic() - self.term_at > TERM_WAIT_S:
                proc.kill()
                break
            seen = records.read(directory)
            if self.preload and self.standby is None and seen.progress.get("trained_at"):
                self._start_standby()  # once the ranks train: the first start is not slowed by its imports
            if pending is not None and seen.progress.get("trained_at"):
                self._completed(pending, seen.progress)
                pending = None
            if first_failure is None and (seen.notes or any(e.get("rc") not in (0, 75) for e in seen.exits)):
                first_failure = time.monotonic()
            if first_failure is None and not self.ending:
                silence = self._silence(seen)
                if silence is None and not said_late:
                    said_late = self._say_late(seen)
                if silence is not None:
                    snapshot, decided_at = seen, time.time()
                    self._end_step(seen)
                    break
            if first_failure is not None and (
                decisive(seen, self.ranks) or time.monotonic() - first_failure > EVIDENCE_S
            ):
                snapshot, decided_at = seen, time.time()
                self._end_step(seen)
                break
        try:
            rc = proc.wait(timeout=END_WAIT_S if snapshot is not None else None)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        ended_at = time.time()
        final = records.read(directory)
        if pending is not None and final.progress.get("trained_at"):
            self._completed(pending, final.progress)
        gone = self._left_the_job() - self.out
        if gone:
            print(f"[restart] Slurm took {', '.join(sorted(gone))} out of job {self.job_ref}", flush=True)
        self.out |= gone
        failure = silence or judge(
            snapshot or final, self.stop_record.exists(), None if snapshot is not None else rc, self.ranks
        )
        failure = left_the_job(failure, sorted(gone & set(nodes)), ended_at)
        if failure.kind == Kind.NODE_FAULT and not history.came_back(failure):
            failure = dataclasses.replace(failure, confirmed=not all(self._gpus_pass(n) for n in failure.nodes))
        usable = set(self.allocation) - self.out
        decision = decide(failure, history, self.limits, usable, self.nodes)
        step = final.progress.get("step")
        if step is None:
            step = next((n.get("step") for n in final.notes if n.get("step") is not None), None)
        rec = {
            "id": f"{self.job}-{self.env['SLURM_RESTART_COUNT']}-{attempt}",
            "job_id": self.job_ref,
            "restart": int(self.env["SLURM_RESTART_COUNT"]),
            "attempt": attempt,
            "kind": failure.kind,
            "what": failure.what,
            "nodes": list(failure.nodes),
            **(
                {"signature": failure.signature, "confirmed": failure.confirmed}
                if failure.kind == Kind.NODE_FAULT
                else {}
            ),
            "action": decision.action,
            "why": decision.why,
            "out": list(decision.out),
            "attempt_nodes": nodes,
            "step": step,
            "fault_at": failure.at,
            "seen_at": failure.seen,
            "decided_at": decided_at or ended_at,
            "ended_at": ended_at,
        }
        if decision.action == Action.RESTART:
            rec["number"] = history.restarts + 1
        if failure.kind != Kind.DONE:
            n = history.restarts + 1
            tail = (
                f"; restarting the ranks (restart {n} of at most {self.limits.max_restarts} in job {self.job_ref})"
                if decision.action == Action.RESTART
                else f": {decision.why}"
            )
            print(f"[restart] {failure.what}{tail}", flush=True)
            append_log(self.log, rec)
        return rec, failure, decision

    def _completed(self, rec: dict, progress: dict) -> None:
        done = {
            "id": rec["id"],
            "job_id": rec["job_id"],
            **{k: progress.get(k) for k in ("load_started_at", "loaded_at", "resumed_step", "trained_at")},
        }
        append_log(self.log, done)
        print(
            f"[restart] restart {rec.get('number')} of job {rec['job_id']}: {timing_line({**rec, **done})}", flush=True
        )

    def _silence(self, seen: records.Records) -> Optional[Failure]:
        """A hang the ranks' heartbeats show (`hpc.node.hang_deadlines`), as the failure naming its ranks' nodes."""
        now = time.time()
        silent = hung(seen.beats, {e.get("rank") for e in seen.exits}, now)
        if not silent:
            return None
        nodes = tuple(sorted({s.node for s in silent}))
        what = "a heartbeat went silent: " + "; ".join(s.line(now) for s in silent)
        return Failure(Kind.HANG, nodes, what, min(s.since for s in silent), 1, now)

    def _say_late(self, seen: records.Records) -> bool:
        """Say once which ranks are past their phase's deadline (none named: the collective timeout names who is
        missing); whether it did."""
        now = time.time()
        found = late(seen.beats, {e.get("rank") for e in seen.exits}, now)
        if found:
            print(
                f"[restart] past their deadline: {'; '.join(s.line(now) for s in found)} (a hang: the collective "
                "timeout names who is missing)",
                flush=True,
            )
        return bool(found)

    def _gpus_pass(self, node: str) -> bool:
        """The health stage's GPU checks on ``node`` (`hpc.node.health`, its lines on this output): whether they pass
        within NODE_CHECK_S."""
        argv = overlap_step([node], [HEALTH_MODULE, "--gpus", str(self.gpus_per_node)])
        print(f"[restart] a suspected node fault on {node}: checking its GPUs", flush=True)
        try:
            r = run_tool(argv, timeout_s=NODE_CHECK_S, env=self.environ)
        except ToolTimeout:
            print(f"[restart] {node}'s GPU checks did not end within {NODE_CHECK_S:.0f} s: taken as failed", flush=True)
            return False
        except ToolMissing:
            print("[restart] srun is not on PATH: the GPU checks cannot run, taken as failed", flush=True)
            return False
        print((r.stdout + r.stderr).rstrip(), flush=True)
        passed = r.returncode == 0
        print(f"[restart] {node} {'passed' if passed else 'failed'} its GPU checks", flush=True)
        return passed

    def _watch_batch_host(self) -> None:
        """Keep `hpc.node.batch_host` running on a node of the job other than this one, the batch host (the last such
        node still in the job: a spare while one is left), started again when its node left the job: under --no-kill
        it requeues the job when this node fails, which Slurm does not."""
        if self.watch is not None and self.watch.poll() is None:
            return
        here = node_name(self.environ)
        others = [n for n in self.allocation if n not in self.out and n != here]
        if not others:
            return
        argv = overlap_step([others[-1]], [BATCH_HOST_MODULE], output=self.root / WATCH_LOG)
        self.watch = subprocess.Popen(argv, env=self.environ, stdin=subprocess.DEVNULL)

    def _start_standby(self) -> None:
        """`hpc.node.standby` on every node still in the job, one task each, beside the ranks: the next start of the
        ranks forks from it (each node's own log: STANDBY_LOG)."""
        nodes = [n for n in self.allocation if n not in self.out]
        argv = overlap_step(
            nodes, [STANDBY_MODULE, "--preload", *self.preload], output=self.root / STANDBY_LOG, kill_on_bad_exit=False
        )
        print(
            f"[restart] a standby on {','.join(nodes)} imports {', '.join(self.preload)} for the next start", flush=True
        )
        self.standby = subprocess.Popen(argv, env=self.environ, stdin=subprocess.DEVNULL)

    def _left_the_job(self) -> set[str]:
        """The allocation's nodes Slurm has taken out of the job (``--no-kill``: a node set DOWN, or not answering,
        leaves the job, which goes on); none when squeue does not answer."""
        try:
            r = run_tool(["squeue", "-h", "-j", self.job, "-o", "%N"], SLURM_TIMEOUT_S)
            held = node_hosts(r.stdout.strip()) if r.returncode == 0 else self.allocation
        except (OSError, HpcError):
            return set()
        return set(self.allocation) - set(held)

    def _end_step(self, seen: records.Records) -> None:
        """Kill what is left of the attempt's step now (its ranks hung, or waiting on the dead)."""
        steps = sorted({s["step"] for s in seen.starts if s.get("step")})
        if not steps:
            try:
                out = run_tool(["squeue", "-h", "-s", "-j", self.job, "-o", "%i"], SLURM_TIMEOUT_S).stdout
            except OSError:
                out = ""
            steps = [line.split(".", 1)[1] for line in out.split() if line.split(".", 1)[-1].isdigit()]
        for step in steps:
            try:
                run_tool(["scancel", "--signal=KILL", f"{self.job}.{step}"], SLURM_TIMEOUT_S)
            except OSError as e:
                print(f"[restart] scancel of step {self.job}.{step} failed: {e}", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=whole(1, MAX_COUNT), required=True, help="nodes the ranks run on")
    p.add_argument("--tasks-per-node", type=whole(1, MAX_COUNT), required=True)
    p.add_argument("--ranks", type=whole(1, 10_000_000), required=True, help="the ranks' world size")
    p.add_argument("--marks", type=path_text, required=True, help="the batch script's bad-node marks of this run")
    p.add_argument("--max-restarts", type=whole(0, MAX_COUNT), default=DEFAULT_MAX_RESTARTS)
    p.add_argument("--max-restarts-per-node", type=whole(1, MAX_COUNT), default=DEFAULT_MAX_RESTARTS_PER_NODE)
    p.add_argument(
        "--gpus-per-node",
        type=whole(0, MAX_GPUS_PER_NODE),
        default=1,
        help="GPUs a node's health check expects (a node fault; 0: a CPU partition)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- srun [OPTIONS] PROGRAM [ARGS]")
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command or not Path(command[0]).name == "srun":
        p.error("give the srun command line after --")
    try:
        supervisor = Supervisor(a, command, os.environ)
        if shutil.which(command[0]) is None:
            raise HpcError(f"{command[0]}: not found on this node's PATH")
        sys.exit(supervisor.run())
    except HpcError as e:
        fail(PROG, e)


if __name__ == "__main__":
    main()
