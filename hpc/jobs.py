"""python -m hpc.jobs: see and manage Slurm jobs without hunting for their files.

    python -m hpc.jobs list [--since TIME]
    python -m hpc.jobs status JOB|ARRAY
    python -m hpc.jobs logs JOB [-f] [--rank R]
    python -m hpc.jobs cancel JOB
    python -m hpc.jobs report JOB|ARRAY [--out PNG] [--tensorboard DIR]

State, restarts and nodes come from Slurm (slurmctld for live jobs, accounting
after; without accounting, what slurmctld knows); files from the job's directory (the
directory of its batch output): task logs ``<id>_<R>_log.out`` (under torchrun/accelerate
task R is node R) and the run's ``metrics.jsonl``. JOB may be one task of an array job
(``123_4``); ``status`` and ``report`` of a whole array (a sweep) show all its tasks side
by side. Unknown jobs exit with 2.
"""

from __future__ import annotations

import argparse
import getpass
import signal
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from hpc.job_outcome import outcome_lines
from hpc.metrics_report import last_line, plot, read_metrics, straggler_lines, summary_table, to_tensorboard
from hpc.node.cli import HpcError, Parser, PrintableWriter, fail, path_text, shown, whole
from hpc.node.contract import (
    LEASE_FILE,
    METRICS_FILE,
    RESTART_LOG,
    RUN_CONFIG,
    checkpoint_step,
    set_aside_step,
    task_log,
)
from hpc.node.files import META_BYTES, NotASmallFile, read_range, read_small_text, regular_file_problem
from hpc.node.restart import read_log, restart_lines
from hpc.slurm_query import (
    Job,
    JobError,
    array_tasks,
    check_controller,
    get_job,
    job_id_arg,
    job_sort_key,
    restarts,
    run_slurm,
    sacct_rows,
    squeue_rows,
)
from hpc.sweep_report import plot_sweep, sweep_table, task_run_dir, task_runs

PROG = "hpc.jobs"

POLL_S = 1.0
LOG_BYTES = 16 << 20  # of a task log, what one read shows (logs: its last 16 MiB; -f: the new bytes in such parts)
NAME_WIDTH = 40


def require_dir(job: Job) -> Path:
    if job.job_dir is None:
        raise JobError(f"job {job.job_id}: Slurm no longer says where its output went (its script is gone)")
    return job.job_dir


def metrics_path(job: Job) -> Path:
    """The run's metrics.jsonl: in the job directory, or in an array task's own run directory."""
    if job.array_task is not None:
        run_dir = task_run_dir(job)
        if run_dir is None:
            raise JobError(f"job {job.job_id}: no task {job.array_task} in the sweep table of {require_dir(job)}")
        return run_dir / METRICS_FILE
    return require_dir(job) / METRICS_FILE


def rank_log(job: Job, rank: int) -> Path:
    """Task `rank`'s log (task 0's also holds the batch script's output)."""
    path = task_log(require_dir(job), job.job_id, rank)
    if not path.exists():
        raise JobError(
            f"job {job.job_id} has no log for task {rank} in {path.parent}" + ("" if job.finished else " (yet)")
        )
    problem = regular_file_problem(path)  # a FIFO there would block the read
    if problem:
        raise JobError(f"job {job.job_id}: {path} is {problem}, not a log")
    return path


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def plot_path(text: str) -> Path:
    """--out: a PNG (or PDF, SVG) path whose directory exists."""
    path = Path(path_text(text))
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{shown(text)}: the plot is written as {', '.join(PLOT_SUFFIXES)} (by its suffix)"
        )
    if not path.resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{shown(text)}: directory {path.resolve().parent} does not exist")
    problem = regular_file_problem(path)  # writing into a FIFO would block; into a directory, fail late
    if problem:
        raise argparse.ArgumentTypeError(f"{shown(text)} is {problem}; give the plot's file name")
    return path


def folder_path(text: str) -> Path:
    """--tensorboard: a directory, or a path whose nearest existing folder is one (it is made)."""
    path = Path(path_text(text))
    above = next(p for p in (path, *path.absolute().parents) if p.exists() or p.is_symlink())
    if not above.is_dir():
        raise argparse.ArgumentTypeError(f"{shown(text)}: {above} is not a directory")
    return path


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows)


def cmd_list(a: argparse.Namespace) -> int:
    user = getpass.getuser()
    runs: dict[str, list[dict]] = {}
    try:
        for row in sacct_rows("-u", user, "-S", a.since):
            runs.setdefault(row["JobID"] or row["JobIDRaw"], []).append(row)  # an array task as squeue names it: 123_4
    except JobError as e:
        if "Invalid time specification" in str(e):
            raise JobError(
                f"--since {a.since}: not a Slurm time (e.g. now-2days, 2026-12-01, 2026-12-01T08:00)"
            ) from None
        print(f"{PROG}: {e}; listing the jobs slurmctld knows", file=sys.stderr)
    jobs = {job_id: {**rs[-1], "Restarts": str(restarts(rs))} for job_id, rs in runs.items()}
    for live in squeue_rows("-u", user):  # slurmctld's view wins: accounting lags behind new jobs
        old = jobs.get(live["JobIDRaw"], {"Elapsed": live["Elapsed"], "Restarts": "0"})
        jobs[live["JobIDRaw"]] = {**live, "Elapsed": old["Elapsed"], "Restarts": old["Restarts"]}
    rows = [("JOBID", "NAME", "STATE", "NODES", "ELAPSED", "RESTARTS")]
    for job_id, job in sorted(jobs.items(), key=lambda kv: job_sort_key(kv[0])):
        name = job["JobName"] if len(job["JobName"]) <= NAME_WIDTH else job["JobName"][: NAME_WIDTH - 3] + "..."
        rows.append((job_id, name, job["State"], job["NNodes"], job["Elapsed"], job["Restarts"]))
    print(table(rows))
    return 0


def array_status(array_id: str, tasks: list[str], out: Optional[Path] = None) -> int:
    """Every task of an array job in one table sorted by final (eval) loss; with ``out``, one plot of them all."""
    runs = task_runs([get_job(t) for t in tasks])
    first = runs[0].job
    print(
        f"array job {array_id} ({first.name}): {len(runs)} tasks, dir {first.job_dir or 'unknown'}; sorted by final "
        "loss "
        "(eval loss where evaluated)"
    )
    print(sweep_table(runs))
    if out is not None:
        if not any(r.records for r in runs):
            raise JobError(f"array job {array_id}: no task has metrics yet")
        try:
            plot_sweep(runs, out, f"array job {array_id} ({first.name}): loss per task")
        except OSError as e:
            raise JobError(f"--out {out}: cannot write it ({e.strerror})") from None
        print(f"plot: {out}")
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    tasks = array_tasks(a.job)
    if tasks:
        return array_status(a.job, tasks)
    job = get_job(a.job)
    print(f"job {job.job_id} ({job.name}): {job.state}")
    print(
        f"  partition {job.partition}, {job.nodes} node(s) {job.nodelist or '-'}, elapsed {job.elapsed}, restarts "
        f"{job.restarts}"
    )
    print(f"  dir {job.job_dir or 'unknown'}")
    for line in outcome_lines(job):
        print(f"  {line}")
    if job.array_task is not None:
        print(f"  task {job.array_task}'s run {task_run_dir(job) or 'unknown'}")
    if job.job_dir:
        path = metrics_path(job)
        records = read_metrics(path)
        print(f"  last {last_line(records)}" if records else f"  no metrics yet ({path})")
        for line in checkpoint_lines(path.parent):
            print(f"  {line}")
        for line in job_restart_lines(job):
            print(f"  {line}")
    return 0


def job_restart_lines(job: Job) -> list[str]:
    """The job's in-job restarts on spare nodes (and the failures not restarted), from <job dir>/restarts.jsonl."""
    decisions = read_log(job.job_dir / RESTART_LOG, job.job_id) if job.job_dir else []
    restarted = sum(d.get("action") == "restart" for d in decisions)
    return [f"in-job restarts: {restarted}"] + restart_lines(decisions) if decisions else []


def checkpoint_lines(run_dir: Path) -> list[str]:
    """The run's checkpoint directory as ``status`` shows it (from the run's config.yaml): the committed steps, the
    checkpoints set aside as damaged (never loaded or pruned: look at their WHY.txt), and a held lease."""
    import yaml

    try:
        cfg = yaml.safe_load(read_small_text(run_dir / RUN_CONFIG, META_BYTES))
        root = Path(cfg["checkpoint"]["dir"] or Path(cfg["log"]["dir"]) / "checkpoints")
        names = sorted(p.name for p in root.iterdir())
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError):
        return []
    steps = [s for n in names if (s := checkpoint_step(n)) is not None]
    lines = [f"checkpoints {root}: " + (f"steps {', '.join(map(str, steps))}" if steps else "none yet")]
    aside = [n for n in names if set_aside_step(n) is not None]
    if aside:
        lines.append(f"set aside as damaged ({len(aside)}, see WHY.txt in each): {', '.join(aside)}")
    if LEASE_FILE in names:
        lines.append(f"in use: {root / LEASE_FILE} is held by a live or unfinished run")
    return lines


def read_log_text(job: Job, rank: int, start: Optional[int]) -> tuple[str, int]:
    """Task ``rank``'s log from byte ``start`` (None: its last LOG_BYTES), at most LOG_BYTES, leniently decoded; and
    the offset after what was read."""
    path = rank_log(job, rank)
    try:
        data, offset = read_range(path, start, LOG_BYTES)
    except NotASmallFile as e:
        raise JobError(f"job {job.job_id}: {e}") from None
    except OSError as e:
        raise JobError(f"job {job.job_id}: {path}: cannot read it ({e.strerror})") from None
    if start is None and offset:
        print(f"[jobs] {path}: its first {offset} bytes left out (the last {LOG_BYTES} shown)", file=sys.stderr)
    return data.decode("utf-8", errors="replace"), offset + len(data)


def cmd_logs(a: argparse.Namespace) -> int:
    job = get_job(a.job)
    if not a.follow:
        sys.stdout.write(read_log_text(job, a.rank, None)[0])
        return 0
    offset: Optional[int] = None
    while True:
        done = job.finished
        try:
            text, offset = read_log_text(job, a.rank, offset)
        except JobError:
            if done:
                raise
            text = ""
        sys.stdout.write(text)
        sys.stdout.flush()
        if done and not text:
            break
        if not text:
            time.sleep(POLL_S)
            job = get_job(a.job)
    print(f"[jobs] job {job.job_id} ended: {job.state}", file=sys.stderr)
    return 0 if job.state.split()[0] == "COMPLETED" else 1


def cmd_cancel(a: argparse.Namespace) -> int:
    tasks = array_tasks(a.job)
    if tasks:
        r = run_slurm(["scancel", a.job])
        if r.returncode != 0:
            raise JobError(f"scancel {a.job} failed: {r.stderr.strip()}")
        print(f"cancelled array job {a.job} ({len(tasks)} tasks)")
        return 0
    job = get_job(a.job)
    if job.finished:
        print(f"job {job.job_id} ({job.name}) already ended: {job.state}")
        return 0
    r = run_slurm(["scancel", job.job_id])
    if r.returncode != 0:
        raise JobError(f"scancel {job.job_id} failed: {r.stderr.strip()}")
    print(f"cancelled job {job.job_id} ({job.name}, was {job.state})")
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    tasks = array_tasks(a.job)
    if tasks:
        if a.tensorboard:
            raise JobError(f"--tensorboard: writes one run; name one task of array job {a.job} (e.g. {tasks[0]})")
        job_dir = get_job(tasks[0]).job_dir
        return array_status(a.job, tasks, a.out if a.out else (job_dir or Path.cwd()) / f"report-{a.job}.png")
    job = get_job(a.job)
    path = metrics_path(job)
    records = read_metrics(path)
    if not records:
        raise JobError(f"job {job.job_id} has no metrics in {path} (yet)")
    out = a.out if a.out else require_dir(job) / f"report-{job.job_id}.png"
    try:
        plot(records, out, f"job {job.job_id} ({job.name}): {job.state}, restarts {job.restarts}")
    except OSError as e:
        raise JobError(f"--out {out}: cannot write it ({e.strerror})") from None
    print(
        f"job {job.job_id} ({job.name}): {job.state}, restarts {job.restarts}, "
        f"steps {records[0]['step']}-{records[-1]['step']} ({len(records)} records) from {path}"
    )
    print(summary_table(records))
    print("\n".join(straggler_lines(records)) or "stragglers: none named")
    for line in job_restart_lines(job):
        print(line)
    print(f"plot: {out}")
    if a.tensorboard:
        try:
            n = to_tensorboard(records, Path(a.tensorboard))
        except ModuleNotFoundError as e:
            raise JobError(
                f"--tensorboard needs the tensorboard package ({e.name} is not installed): pip install tensorboard"
            ) from None
        print(f"tensorboard: {n} scalars in {a.tensorboard} (tensorboard --logdir {a.tensorboard})")
    return 0


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=f"python -m {PROG}",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("list", help="your jobs: id, name, state, nodes, elapsed, restarts")
    s.add_argument("--since", default="now-7days", help="sacct start time (default: now-7days)")
    s.set_defaults(run=cmd_list)
    s = sub.add_parser(
        "status", help="Slurm state, restarts, nodes and the last step's metrics (of every task of an array)"
    )
    s.add_argument("job", type=job_id_arg)
    s.set_defaults(run=cmd_status)
    s = sub.add_parser("logs", help="print a rank's log; -f follows it until the job ends")
    s.add_argument("job", type=job_id_arg)
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument(
        "--rank",
        type=whole(0, 100_000),
        default=0,
        help="Slurm task (default 0); one task per node under torchrun/accelerate",
    )
    s.set_defaults(run=cmd_logs)
    s = sub.add_parser("cancel", help="scancel the job (every task of an array job)")
    s.add_argument("job", type=job_id_arg)
    s.set_defaults(run=cmd_cancel)
    s = sub.add_parser(
        "report",
        help="PNG of loss, tokens/s and MFU against the step, and a summary table; of an array: every task's loss",
    )
    s.add_argument("job", type=job_id_arg)
    s.add_argument("--out", type=plot_path, help="PNG path (default: <job dir>/report-<id>.png)")
    s.add_argument(
        "--tensorboard", metavar="DIR", type=folder_path, help="also write the metrics as TensorBoard scalars into DIR"
    )
    s.set_defaults(run=cmd_report)
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    a = parser().parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `hpc.jobs logs JOB | head` ends quietly
    stdout = sys.stdout
    if a.command != "logs":  # what Slurm and the job's records say is shown, its control codes escaped (a log is the
        sys.stdout = PrintableWriter(stdout)  # program's own output, shown as it is)
    try:
        check_controller()
        rc = a.run(a)
    except HpcError as e:
        fail(PROG, e)
    finally:
        sys.stdout = stdout
    sys.exit(rc)


if __name__ == "__main__":
    main()
