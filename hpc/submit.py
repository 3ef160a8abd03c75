"""python -m hpc.submit: render a job for a site profile and submit it through submitit.

    python -m hpc.submit --site local --nodes 2 [--partition P] [--gpus-per-node G]
        [--time T] [--job-name N] [--launcher srun|torchrun|accelerate] [--dry-run] [--emit FILE] [--wait]
        [-- TRAINER ARGS | -- -m MODULE ARGS | -- SCRIPT.py ARGS]

With nothing after ``--`` every rank runs the trainer with the site's default
training config. ``--dry-run`` prints the sbatch script and submits nothing;
``--emit FILE`` writes it for a later ``sbatch FILE``. Bad input exits with 2
before anything is submitted.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from hpc.launch import LaunchTask
from hpc.render import directives, preamble_lines, render_sbatch, srun_args
from hpc.plan import PlanError, plan_trainer_args
from hpc.site import SiteError, load_site
from hpc.spec import JobSpec, SpecError, add_allocation_args, build_spec, prepare_submission
from hpc.slurm_env import LAUNCHERS
from hpc.slurm_query import FINAL as FINAL_STATES

# A preempted job of ours is requeued and comes back: --wait keeps following it.
FINAL = FINAL_STATES - {"PREEMPTED"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpc.submit", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_allocation_args(p, "time limit, Slurm form (e.g. 30, 2:00:00, 1-00:00:00); default: the partition's")
    p.add_argument("--job-name", help="job name (default: train)")
    p.add_argument("--launcher", default="srun", metavar="|".join(LAUNCHERS),
                   help="srun: one task per GPU (default); torchrun, accelerate: one task per node running torchrun / accelerate launch")
    p.add_argument("--signal", help="pre-stop signal for every rank, e.g. USR2 (default: the profile's preemption.signal)")
    p.add_argument("--signal-lead", type=int, metavar="SECONDS", help="send it this long before the time limit (default: the profile's)")
    p.add_argument("--max-requeues", type=int, metavar="N", help="requeues after which a stopped job ends (default: the profile's)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--dry-run", action="store_true", help="print the sbatch script, submit nothing")
    out.add_argument("--emit", metavar="FILE", help="write the sbatch script to FILE, submit nothing")
    p.add_argument("--wait", action="store_true", help="block until the job ends; exit with its status")
    return p


def fail(msg: str) -> None:
    print(f"hpc.submit: error: {msg}", file=sys.stderr)
    sys.exit(2)


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def make_spec(a: argparse.Namespace, rank_args: list[str]) -> JobSpec:
    try:
        site = load_site(a.site)
        kw = dict(nodes=a.nodes, partition=a.partition, gpus_per_node=a.gpus_per_node,
                  time=a.time, job_name=a.job_name, launcher=a.launcher,
                  signal=a.signal, signal_lead_s=a.signal_lead, max_requeues=a.max_requeues)
        spec = build_spec(site, args=rank_args, **kw)
        args, note = plan_trainer_args(site, spec.partition, spec.nodes, spec.gpus_per_node, rank_args)
        if note:
            print(note, file=sys.stderr)
            spec = build_spec(site, args=args, **kw)
        return spec
    except (SiteError, SpecError, PlanError) as e:
        fail(str(e))
        raise


def emit(spec: JobSpec, path: Path) -> None:
    spec.job_dir.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_sbatch(spec))
    print(f"wrote {path}\nsubmit it with: sbatch {path}\nlogs will be in {spec.job_dir}/ (<jobid>.log, <jobid>-rank<N>.log)")


def executor_for(spec: JobSpec):
    import submitit

    ex = submitit.SlurmExecutor(folder=str(spec.job_dir), python=spec.python)
    params = {k.replace("-", "_"): v for k, v in directives(spec).items()}
    ex.update_parameters(
        nodes=spec.nodes, ntasks_per_node=spec.tasks_per_node, time=spec.minutes,
        setup=preamble_lines(spec), srun_args=srun_args(spec), stderr_to_stdout=True,
        additional_parameters=params,
    )
    return ex


def submit(spec: JobSpec):
    try:
        prepare_submission(spec)
    except SpecError as e:
        fail(str(e))
    job = executor_for(spec).submit(LaunchTask(spec.launcher, spec.command, spec.gpus_per_node if spec.launcher != "srun" else None))
    rank0 = job.paths.stdout
    print(f"submitted job {job.job_id} ({spec.nodes} node(s) x {spec.gpus_per_node} GPU(s), partition {spec.partition.name}, site {spec.site.name})")
    print(f"script:   {job.paths.submission_file}")
    print(f"rank 0:   {rank0}")
    print(f"all logs: {spec.job_dir}/{job.job_id}_<rank>_log.out")
    print(f"follow:   tail -f {rank0}    state: squeue -j {job.job_id}; sacct -j {job.job_id}")
    return job


def wait(job, poll_s: float = 2.0) -> int:
    """Follow rank 0's log until the job ends; 0 when it completed, 1 otherwise."""
    shown, state = 0, None
    while True:
        job.done(force_check=True)  # refreshes submitit's view of sacct now
        new_state = job.state
        done = new_state.split()[0] in FINAL
        if new_state != state:
            state = new_state
            print(f"[wait] job {job.job_id}: {state}", flush=True)
        log = Path(job.paths.stdout)
        if log.exists():
            text = log.read_text(errors="replace")
            if len(text) > shown:
                sys.stdout.write(text[shown:])
                sys.stdout.flush()
                shown = len(text)
        if done:
            break
        time.sleep(poll_s)
    final = job.state
    if final.split()[0] == "COMPLETED":
        print(f"[wait] job {job.job_id} finished: {final}")
        return 0
    print(f"[wait] job {job.job_id} ended {final}; logs: {Path(job.paths.stdout).parent}", file=sys.stderr)
    return 1


def main(argv: Optional[Sequence[str]] = None) -> None:
    own, rank_args = split_args(sys.argv[1:] if argv is None else argv)
    a = parser().parse_args(own)
    if a.wait and (a.dry_run or a.emit):
        fail("--wait submits and waits; it does not go with --dry-run or --emit")
    spec = make_spec(a, rank_args)
    if a.dry_run:
        sys.stdout.write(render_sbatch(spec))
        return
    if a.emit:
        emit(spec, Path(a.emit).resolve())
        return
    job = submit(spec)
    if a.wait:
        sys.exit(wait(job))


if __name__ == "__main__":
    main()
