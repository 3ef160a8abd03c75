"""JobSpec -> sbatch text, from the jinja2 templates in sbatch_templates/ (package data).

`render_sbatch` is the one script of a job: what ``--dry-run`` prints, what ``--emit``
writes and what ``hpc.submit`` submits are the same text.
"""

from __future__ import annotations

import shlex
import sys
from typing import Optional

import jinja2

from hpc.dependency import dependency_directive
from hpc.gpu_request import JOB_GRES_FLAGS, SRUN_GRES_FLAGS, job_gpu_options
from hpc.job_env import job_env as merged_job_env
from hpc.node import contract
from hpc.node.contract import (
    ARRAY_TASK_ID,
    BATCH_LOG,
    HEALTH_MODULE,
    JOB_DIR_VAR,
    JOB_NAME_VAR,
    LAUNCH_MODULE,
    MAX_REQUEUES_VAR,
    RESTART_MODULE,
    STOP_SIGNAL_VAR,
    SUBMIT_MODULE,
    TASK_LOG,
)
from hpc.node.runtime import runtime
from hpc.shipped import TEMPLATE_DIR
from hpc.slurm_time import format_minutes
from hpc.spec import JobSpec
from hpc.sweep import task_args

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)


class ShellWord(str):
    """A word written into the script as it is, for its shell to expand (the q filter quotes every other word)."""


_env.filters["q"] = lambda v: v if isinstance(v, ShellWord) else shlex.quote(str(v))
# pyxis keeps a named container on the node after the job: one name per job and run, so the job's steps share it and no
# later job (or requeued run) starts in a container an earlier one left behind
PYXIS_NAME = ShellWord('--container-name=hpc-"$SLURM_JOB_ID"-"${SLURM_RESTART_COUNT:-0}"')


def gpu_options(spec: JobSpec, nodes: int) -> dict[str, str]:
    """The GPU request of ``nodes`` of the job's nodes in the partition's form: with ``spec.allocated_nodes`` (spares
    included) the job's #SBATCH line and the health step's; with ``spec.nodes`` the ranks' step on spares under the
    ``gpus`` form (whose total the step would otherwise inherit from the job: more than its nodes hold)."""
    part = spec.partition
    return job_gpu_options(part.gpu_request, part.gpu_type, spec.gpus_per_node, nodes)


def directives(spec: JobSpec) -> dict[str, str | bool]:
    """sbatch options (without output/error), in the order they are written; True is a bare flag."""
    part, sub = spec.partition, spec.site.submission
    d = {
        "job-name": spec.job_name,
        "partition": part.name,
        "nodes": str(spec.allocated_nodes),
        "ntasks-per-node": str(spec.tasks_per_node),
        **gpu_options(spec, spec.allocated_nodes),
        "cpus-per-task": str(spec.cpus_per_task),
        "time": format_minutes(spec.minutes),
        "chdir": str(spec.workdir),
        "open-mode": "append",
        "signal": f"{spec.signal}@{spec.signal_lead_s}",
        "requeue": True,
    }
    if spec.spare_nodes:
        d["no-kill"] = True  # a node that fails ends its step, not the allocation: the spares take its place
    if spec.sweep is not None:
        d["array"] = spec.sweep.array
    if spec.nodelist:
        d["nodelist"] = spec.nodelist
    if spec.exclude:
        d["exclude"] = spec.exclude
    if spec.after:
        d["dependency"] = dependency_directive(spec.after)
    job_flags = [f for f in part.gres_flags if f in JOB_GRES_FLAGS]
    if job_flags:
        d["gres-flags"] = ",".join(job_flags)
    if part.mem_per_node_gb:
        d["mem"] = f"{int(part.mem_per_node_gb)}G"
    if sub.account:
        d["account"] = sub.account
    if sub.qos:
        d["qos"] = sub.qos
    d.update(sub.extra_sbatch)
    return d


def job_env(spec: JobSpec) -> dict[str, str]:
    """Every variable the preamble exports: network first, then the profile's, then the job's (`hpc.job_env`)."""
    job: dict[str, Optional[str]] = {
        "OMP_NUM_THREADS": str(spec.threads_per_rank),
        JOB_NAME_VAR: spec.job_name,
        JOB_DIR_VAR: str(spec.job_dir),
        STOP_SIGNAL_VAR: spec.signal,
        MAX_REQUEUES_VAR: str(spec.max_requeues),
    }
    if spec.container and spec.container.project == "mount":
        job["PYTHONPATH"] = str(spec.places.project)
    if spec.container is None and spec.python == sys.executable:  # the nodes run the interpreter that submits: what
        job.update(runtime())  # it has here, they must have
    site = spec.site
    return merged_job_env(site.network, site.environment.variables, site.mounts_project(), job)


def preamble_lines(spec: JobSpec) -> list[str]:
    """The environment/network preamble, one shell line each."""
    env = spec.site.environment
    text = _env.get_template("preamble.sh.j2").render(
        site=spec.site.name,
        modules=env.modules,
        setup=env.setup,
        env=job_env(spec),
    )
    return text.rstrip("\n").split("\n")


def binding_args(spec: JobSpec, ranks: bool) -> list[str]:
    """The partition's --cpu-bind for every step; for the ranks' step (``ranks``) also its --gpu-bind and the srun-only
    --gres-flags (allow-task-sharing), where a task is a rank (under torchrun or accelerate one task per node holds all
    of the node's GPUs, so it is not bound to some of them)."""
    part = spec.partition
    args = [f"--cpu-bind={part.cpu_bind}"] if part.cpu_bind else []
    if ranks and not spec.launcher.per_node:
        args += [f"--gpu-bind={part.gpu_bind}"] if part.gpu_bind else []
        flags = [f for f in part.gres_flags if f in SRUN_GRES_FLAGS]
        args += [f"--gres-flags={','.join(flags)}"] if flags else []
    return args


def spare_step_gpus(spec: JobSpec) -> list[str]:
    """With spares under the ``gpus`` form, the ranks' step asks for its own nodes' GPUs (``--gpus`` is a total)."""
    if not spec.spare_nodes or spec.partition.gpu_request != "gpus":
        return []
    return [f"--{k}={v}" for k, v in gpu_options(spec, spec.nodes).items()]


def srun_args(spec: JobSpec) -> list[str]:
    """Options of the srun that starts the ranks."""
    # with spare nodes hpc.node.restart ends the step once the ranks' records say what failed
    kill = "--kill-on-bad-exit=0" if spec.spare_nodes else "--kill-on-bad-exit=1"
    args = [
        kill,
        f"--ntasks-per-node={spec.tasks_per_node}",
        f"--cpus-per-task={spec.cpus_per_task}",  # not inherited from the job by 22.05 to 23.02 (slurm_version.py)
        *binding_args(spec, ranks=True),
        *spare_step_gpus(spec),
        f"--output={spec.job_dir / log_pattern(spec, TASK_LOG)}",
    ]
    if spec.container and not spec.container.wrapped:
        args += [*spec.container.srun_options(spec.places), PYXIS_NAME]
    return args


def launch_argv(spec: JobSpec) -> list[str]:
    """What srun starts on each task: the node-side launch (with the container runtime's command it runs the rank
    command behind, for apptainer/singularity/command; under pyxis srun itself enters the image), then the rank
    command."""
    wrapped = spec.container and spec.container.wrapped
    container = shlex.join(spec.container.prefix(spec.places)) if wrapped else None
    return spec.launcher.task_argv(spec.launch_python, spec.gpus_per_node, spec.command, container)


def health_argv(spec: JobSpec) -> list[str]:
    """The preflight step (``--preflight``): hpc.node.health once per node, in the ranks' python (and image), judged
    against the partition's matmul and copy rates."""
    part = spec.partition
    argv = [
        "srun",
        f"--nodes={spec.allocated_nodes}",
        f"--ntasks={spec.allocated_nodes}",
        "--ntasks-per-node=1",  # in this one task
        f"--cpus-per-task={spec.cpus_per_task * spec.tasks_per_node}",  # all of the node's CPUs the job holds
        *(f"--{k}={v}" for k, v in gpu_options(spec, spec.allocated_nodes).items()),  # all of each node's GPUs
        *binding_args(spec, ranks=False),
    ]
    if spec.container and not spec.container.wrapped:
        argv += [*spec.container.srun_options(spec.places), PYXIS_NAME]
    elif spec.container:
        argv += spec.container.prefix(spec.places)
    argv += [spec.command[0], "-u", "-m", HEALTH_MODULE, "--gpus", str(spec.health_gpus)]
    for flag, value in (("--matmul-tflops", part.matmul_tflops), ("--copy-gbps", part.copy_gbps)):
        argv += [flag, f"{value:g}"] if value else []
    return argv


def restart_argv(spec: JobSpec) -> list[str]:
    """With spare nodes: hpc.node.restart, which runs the srun of the ranks on ``spec.nodes`` of the allocation's nodes
    and again within the job after a failure that names a node (its ``--marks`` and the srun line follow)."""
    if not spec.spare_nodes:
        return []
    r = spec.site.restart
    return [
        spec.python,
        "-u",
        "-m",
        RESTART_MODULE,
        "--nodes",
        str(spec.nodes),
        "--tasks-per-node",
        str(spec.tasks_per_node),
        "--ranks",
        str(spec.world_size),
        "--max-restarts",
        str(r.max_restarts),
        "--max-restarts-per-node",
        str(r.max_restarts_per_node),
        "--gpus-per-node",
        str(spec.health_gpus),
    ]


def log_pattern(spec: JobSpec, pattern: str) -> str:
    """A log file pattern for Slurm: %j, or in an array job %A_%a (the ARRAY_TASK id)."""
    return pattern.replace("%j", ARRAY_TASK_ID) if spec.sweep is not None else pattern


def sweep_cases(spec: JobSpec) -> list[dict]:
    """The array's task table, for the script's comments and its `case` on $SLURM_ARRAY_TASK_ID."""
    if spec.sweep is None:
        return []
    return [
        {
            "index": t.index,
            "overrides": " ".join(t.overrides),
            "dir": spec.job_dir / t.dir_name,
            "args": task_args(t, spec.job_dir, spec.checkpoint_dir),
            "owner": t.owner(spec.job_name),
        }
        for t in spec.sweep.tasks
    ]


def render_sbatch(spec: JobSpec) -> str:
    """The complete sbatch file: `sbatch FILE` submits it unchanged."""
    return _env.get_template("job.sbatch.j2").render(
        spec=spec,
        directives={**directives(spec), "output": str(spec.job_dir / log_pattern(spec, BATCH_LOG))},
        preamble=preamble_lines(spec),
        srun=["srun", *srun_args(spec)],
        launch=launch_argv(spec),
        restart=restart_argv(spec),
        launch_module=LAUNCH_MODULE,
        restart_module=RESTART_MODULE,
        submit_module=SUBMIT_MODULE,
        stop_record=f"{shlex.quote(str(spec.job_dir))}/"
        + contract.STOP_RECORD.format(job_id='"$SLURM_JOB_ID"', restart='"${SLURM_RESTART_COUNT:-0}"'),
        record_var=contract.STOP_RECORD_VAR,
        max_var=MAX_REQUEUES_VAR,
        requeue_grace_s=contract.REQUEUE_GRACE_S,
        cases=sweep_cases(spec),
        job_name_var=JOB_NAME_VAR,
        health=health_argv(spec) if spec.preflight else [],
        marks=shlex.quote(str(spec.job_dir))
        + "/"
        + contract.UNHEALTHY_MARKS.format(job_id='"$SLURM_JOB_ID"', restart='"${SLURM_RESTART_COUNT:-0}"'),
        all_marks=contract.UNHEALTHY_MARKS.format(job_id="$SLURM_JOB_ID", restart="*"),
        max_excluded=spec.site.preemption.max_excluded_nodes,
        marks_var=contract.BAD_NODE_MARKS_VAR,
    )
