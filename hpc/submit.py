"""python -m hpc.submit: render a job for a site profile and submit it through submitit.

    python -m hpc.submit --site local --nodes 2 [--partition P] [--gpus-per-node G]
        [--time T] [--nodelist NODES] [--exclude NODES] [--preflight] [--spare-nodes K] [--job-name N] [--launcher
        srun|torchrun|accelerate] [--container IMAGE]
        [--sweep KEY=V1,V2 ...] [--max-parallel K] [--after JOB[:ok|any|notok] ...]
        [--dry-run | --emit FILE | --test-only] [--wait]
        [-- TRAINER ARGS | -- -m MODULE ARGS | -- SCRIPT.py ARGS]

With nothing after ``--`` every rank runs the trainer with the site's default
training config. ``--dry-run`` prints the sbatch script (it asks Slurm nothing);
``--emit FILE`` writes it for a later ``sbatch FILE``; ``--test-only`` asks
``sbatch --test-only`` where and when it would start. ``--sweep`` makes one array job
over the cartesian product of the values (hpc/sweep.py); ``--after`` chains it after
other jobs (hpc/dependency.py). Bad input exits with 2
before anything is submitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from hpc.node.cli import HpcError, Parser, check_utf8, fail, path_text, whole
from hpc.node.contract import SUBMIT_MODULE, task_log
from hpc.node.launcher import LAUNCHERS, SRUN
from hpc.render import render_sbatch
from hpc.site import load_site
from hpc.spec import MAX_COUNT, JobSpec, SpecError, add_allocation_args, build_spec, check_rank_command, plan_trainer
from hpc.submitter import check_after, first_log, follow, submit, test_only
from hpc.sweep import write_table
from hpc.trainer_job import batch_note
from train.front.config import TrainConfig
from train.front.run_check import ignored_settings

PROG = SUBMIT_MODULE


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=f"python -m {PROG}",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_allocation_args(p, "time limit, Slurm form (e.g. 30, 2:00:00, 1-00:00:00); default: the partition's")
    p.add_argument("--job-name", help="job name (default: train)")
    p.add_argument(
        "--launcher",
        default=SRUN.name,
        metavar="|".join(LAUNCHERS),
        help="; ".join(f"{name}: {launcher.help}" for name, launcher in LAUNCHERS.items()) + f" (default {SRUN.name})",
    )
    p.add_argument(
        "--signal", help="pre-stop signal for every rank, e.g. USR2 (default: the profile's preemption.signal)"
    )
    p.add_argument(
        "--signal-lead",
        type=whole(0, 10**7),
        metavar="SECONDS",
        help="send it this long before the time limit (default: the profile's)",
    )
    p.add_argument(
        "--max-requeues",
        type=whole(0, MAX_COUNT),
        metavar="N",
        help="requeues after which a stopped job ends (default: the profile's)",
    )
    p.add_argument(
        "--container",
        metavar="IMAGE",
        help="run in this image (default: the profile's container.image; needs a container section)",
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="trainer override values to sweep (repeatable): one array task per combination",
    )
    p.add_argument(
        "--max-parallel",
        type=whole(1, MAX_COUNT),
        metavar="K",
        help="at most K tasks of the sweep at a time (--array=0-N%%K)",
    )
    p.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="JOB[:ok|any|notok]",
        help="start after JOB ended COMPLETED (ok, the default), in any state (any), or not COMPLETED (notok); "
        "repeatable",
    )
    p.add_argument(
        "--preflight",
        action="store_true",
        help="first check every node's GPUs inside the job (hpc.node.health); a failing node stops the job before "
        "training",
    )
    p.add_argument(
        "--spare-nodes",
        type=whole(0, MAX_COUNT),
        metavar="K",
        help="allocate K more nodes: a failure that names a node restarts the ranks within the job with a spare in its "
        "place, from the newest checkpoint (default: the profile's restart.spare_nodes)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--dry-run", action="store_true", help="print the sbatch script, submit nothing")
    out.add_argument("--emit", metavar="FILE", type=path_text, help="write the sbatch script to FILE, submit nothing")
    out.add_argument(
        "--test-only",
        action="store_true",
        help="ask sbatch --test-only where and when the job would start; submit nothing",
    )
    p.add_argument("--wait", action="store_true", help="block until the job ends; exit with its status")
    return p


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def planned_spec(a: argparse.Namespace, rank_args: list[str]) -> tuple[JobSpec, Optional[TrainConfig]]:
    """The command line's job checked against the site profile (built once), with the planner's layout added to the
    trainer's part where it adds one; and the trainer's config as its ranks will load it (None for a script or
    module)."""
    spec = build_spec(
        load_site(a.site),
        args=rank_args,
        nodes=a.nodes,
        partition=a.partition,
        gpus_per_node=a.gpus_per_node,
        time=a.time,
        job_name=a.job_name,
        launcher=a.launcher,
        signal=a.signal,
        signal_lead_s=a.signal_lead,
        max_requeues=a.max_requeues,
        container_image=a.container,
        sweep=a.sweep,
        max_parallel=a.max_parallel,
        after=a.after,
        nodelist=a.nodelist,
        exclude=a.exclude,
        preflight=a.preflight,
        spare_nodes=a.spare_nodes,
    )
    spec, cfg, note = plan_trainer(spec)
    if note:
        print(note, file=sys.stderr)
    return spec, cfg


def make_spec(a: argparse.Namespace, rank_args: list[str]) -> JobSpec:
    """The job, with everything its ranks will run checked (the trainer's config loaded once); Slurm is not asked."""
    spec, cfg = planned_spec(a, rank_args)
    check_rank_command(spec, cfg)
    for line in ignored_settings(cfg) if cfg is not None else ():
        print(f"{PROG}: warning: trainer: {line}", file=sys.stderr)
    note = batch_note(cfg, spec.world_size, spec.gpus_per_node) if cfg is not None else None
    if note:
        print(f"{PROG}: note: trainer: {note}", file=sys.stderr)
    return spec


def made_dirs(directory: Path) -> list[Path]:
    """``directory`` and its ancestors that do not exist yet, deepest first (what a mkdir -p would make)."""
    return [d for d in (directory, *directory.parents) if not d.exists()]


def emit(spec: JobSpec, path: Path) -> None:
    """Write the script to ``path`` and make the job directory (once Slurm knows the --after jobs); on an error
    neither is left behind."""
    check_after(spec)
    text = render_sbatch(spec)
    made = made_dirs(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise SpecError(f"--emit {path}: cannot write it ({e.strerror})") from None
    made += made_dirs(spec.job_dir)
    try:
        spec.job_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        path.unlink()
        for d in made:
            if d.exists():
                d.rmdir()
        raise SpecError(f"paths.job_dir: {spec.job_dir}: cannot create it ({e.strerror})") from None
    if spec.sweep is not None:
        write_table(spec.sweep, spec.job_name, spec.job_dir)
    print(
        f"wrote {path}\nsubmit it with: sbatch {path}\nlogs will be in {spec.job_dir}/ ({log_names(spec, '<jobid>')})"
    )


def log_names(spec: JobSpec, job_id: str) -> str:
    """The job's log files' names (an array task's id is ARRAY_TASK)."""
    return task_log(Path(), f"{job_id}_<array task>" if spec.sweep is not None else job_id, "<task>").name


def task_table(spec: JobSpec) -> str:
    """The sweep's tasks: index, overrides, directory."""
    rows = [("task", "overrides", "directory")] + [
        (str(t.index), " ".join(t.overrides), str(spec.job_dir / t.dir_name)) for t in spec.sweep.tasks
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"  {r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows)


def submit_and_report(spec: JobSpec):
    job = submit(spec)
    array = f", an array of {len(spec.sweep.tasks)} tasks" if spec.sweep is not None else ""
    spares = f" + {spec.spare_nodes} spare(s)" if spec.spare_nodes else ""
    print(
        f"submitted job {job.job_id} ({spec.nodes} node(s){spares} x {spec.gpus_per_node} GPU(s){array}, "
        f"partition {spec.partition.name}, site {spec.site.name})"
    )
    print(f"script:   {job.paths.submission_file}")
    if spec.sweep is not None:
        print(task_table(spec))
        print(
            f"requeue one task: scontrol requeue {job.job_id}_<task>    all tasks: python -m hpc.jobs report "
            f"{job.job_id}"
        )
    else:
        print(f"rank 0:   {first_log(spec, job.job_id)}")
    print(f"all logs: {spec.job_dir}/{log_names(spec, job.job_id)}")
    one = f"{job.job_id}_0" if spec.sweep is not None else job.job_id
    print(f"follow:   python -m hpc.jobs logs {one} -f    state: python -m hpc.jobs status {job.job_id}")
    return job


def wait(spec: JobSpec, job_id: str) -> int:
    """Follow task 0's log until the job ends; 0 when it completed, 1 otherwise."""
    state = follow(job_id, first_log(spec, job_id))
    if state == "COMPLETED":
        print(f"[wait] job {job_id} finished: {state}")
        return 0
    print(f"[wait] job {job_id} ended {state}; logs: {spec.job_dir}", file=sys.stderr)
    return 1


def run(argv: Sequence[str]) -> int:
    own, rank_args = split_args(argv)
    a = parser().parse_args(own)
    for arg in rank_args:
        check_utf8(arg, "rank argument")
    if a.wait and (a.dry_run or a.emit is not None or a.test_only):
        raise SpecError("--wait submits and waits; it does not go with --dry-run, --emit or --test-only")
    if a.wait and a.sweep:
        raise SpecError("--wait follows one job; a sweep is an array: follow it with python -m hpc.jobs status ARRAY")
    spec = make_spec(a, rank_args)
    if a.dry_run:
        sys.stdout.write(render_sbatch(spec))
        if spec.sweep is not None:
            print(
                f"{len(spec.sweep.tasks)} array tasks (--array={spec.sweep.array}):\n{task_table(spec)}",
                file=sys.stderr,
            )
        return 0
    if a.test_only:
        print(f"{test_only(spec)}\n(sbatch --test-only: nothing was submitted)")
        return 0
    if a.emit is not None:
        emit(spec, Path(a.emit).resolve())
        return 0
    job = submit_and_report(spec)
    return wait(spec, job.job_id) if a.wait else 0


def main(argv: Optional[Sequence[str]] = None) -> None:
    try:
        sys.exit(run(sys.argv[1:] if argv is None else argv))
    except HpcError as e:
        fail(PROG, e)


if __name__ == "__main__":
    main()
