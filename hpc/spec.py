"""JobSpec: the one validated description of a job (site, partition, shape, time, launcher, command). Building and
checking it reads files but asks Slurm nothing and writes nothing: that happens beside submission (hpc/submitter.py)."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from pydantic import ValidationError

from hpc.container import Container, Places
from hpc.dependency import parse_after
from hpc.gpu_binding import check_job_bind
from hpc.node.cli import HpcError, path_text, shown, whole
from hpc.node.contract import MAX_COUNT, PROJECT_MODULE, TRAINER_MODULE
from hpc.node.launcher import SRUN, Launcher, get_launcher
from hpc.node.ownership import check_owner, run_dir_name
from hpc.node.tool import run_tool
from hpc.plan import plan_layout
from hpc.site import Partition, Preemption, SiteError, SiteProfile
from hpc.slurm_time import format_minutes, parse_minutes
from hpc.sweep import Sweep, build_sweep, task_args
from hpc.trainer_job import TrainerJob, runs_trainer, trainer_job
from train.front.config import ConfigError, TrainConfig
from train.front.interface import CHECKPOINT_DIR_KEY, LOG_DIR_KEY
from train.front.layout import WorldEnv
from train.front.run_check import check_run

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the directory that holds the hpc and train packages

PROBE_TIMEOUT_S = 60  # the rank python asked whether it finds the module

MAX_JOB_NAME = 200


class SpecError(HpcError):
    """Bad command-line input; the message names the flag and what is allowed."""


@dataclass(frozen=True)
class JobSpec:
    site: SiteProfile
    partition: Partition
    nodes: int
    gpus_per_node: int
    minutes: int
    job_name: str
    launcher: Launcher
    program: tuple[
        str, ...
    ]  # after ``python -u``: a script or ``-m MODULE`` with its arguments (the trainer: see trainer)
    job_dir: Path
    checkpoint_dir: Path
    workdir: Path
    python: str
    signal: str
    signal_lead_s: int
    max_requeues: int
    container: Optional[Container] = None
    sweep: Optional[Sweep] = None  # an array job: one task per combination of the sweep values
    after: tuple[str, ...] = ()  # sbatch dependencies, e.g. "afterok:123"
    nodelist: Optional[str] = None  # a Slurm hostlist the job must run on (--nodelist)
    exclude: Optional[str] = None  # a Slurm hostlist the job must not run on (--exclude)
    preflight: bool = False  # run hpc.node.health on every node before the ranks start
    trainer: Optional[TrainerJob] = None  # the trainer's part, when the ranks run the trainer
    spare_nodes: int = 0  # nodes allocated beyond ``nodes`` for in-job restarts (hpc/node/restart.py)

    @property
    def places(self) -> Places:
        return Places(
            workdir=self.workdir, job_dir=self.job_dir, checkpoint_dir=self.checkpoint_dir, project=PROJECT_ROOT
        )

    @property
    def tasks_per_node(self) -> int:
        return self.launcher.tasks_per_node(self.gpus_per_node)

    @property
    def cpus_per_task(self) -> int:
        return max(1, self.partition.cpus_per_node // self.tasks_per_node)

    @property
    def threads_per_rank(self) -> int:
        """OMP threads of one rank: a node's CPUs shared by its ranks (under torchrun/accelerate one task runs them
        all)."""
        return max(1, self.partition.cpus_per_node // self.gpus_per_node)

    @property
    def runs_trainer(self) -> bool:
        return self.trainer is not None

    @property
    def command(self) -> tuple[str, ...]:
        """What every rank runs: the trainer with its part's arguments (through `hpc.node.project_module`, so a
        train.py of the user's in the working directory is not taken for it), or the program (each array task's
        overrides are added in the script)."""
        python = self.container.python if self.container else self.python
        if self.trainer is None:
            return (python, "-u", *self.program)
        return (python, "-u", "-m", PROJECT_MODULE, TRAINER_MODULE, *self.trainer.args())

    @property
    def launch_python(self) -> str:
        """The python that runs hpc.node.launch: inside the image under pyxis (srun enters it), else the nodes' own."""
        return self.container.python if self.container and not self.container.wrapped else self.python

    @property
    def health_gpus(self) -> int:
        """GPUs per node the GPU health checks expect: the job's, none on a CPU partition (gpu_request: none)."""
        return 0 if self.partition.gpu_request == "none" else self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def allocated_nodes(self) -> int:
        """The nodes the job asks Slurm for: the ranks' and the spares."""
        return self.nodes + self.spare_nodes


def add_allocation_args(p: argparse.ArgumentParser, time_help: str, time_default: Optional[str] = None) -> None:
    """The flags every submitting command shares: --site, --nodes, --partition, --gpus-per-node, --time."""
    p.add_argument(
        "--site",
        required=True,
        type=path_text,
        help="profile name (looked up in $HPC_SITE_DIRS, ./, ~/.config/hpc/sites/, the shipped ones: docs/sites.md) "
        "or a YAML path",
    )
    p.add_argument("--nodes", type=whole(1, MAX_COUNT), required=True)
    p.add_argument("--partition", help="partition name (default: the profile's default)")
    p.add_argument(
        "--gpus-per-node", type=whole(1, MAX_COUNT), help="GPUs (ranks) per node (default: all of the partition's)"
    )
    p.add_argument("--time", default=time_default, help=time_help)
    p.add_argument(
        "--nodelist", metavar="NODES", help="run on these nodes, Slurm hostlist syntax (e.g. n[1-2] or gpu07,gpu09)"
    )
    p.add_argument(
        "--exclude", metavar="NODES", help="never run on these nodes, Slurm hostlist syntax (e.g. n3 or gpu[07-08])"
    )


NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse_nodes(flag: str, text: Optional[str]) -> list[str]:
    """The node names of a Slurm hostlist given to ``flag`` (e.g. 'n[1-3],gpu07'), each checked; [] for None."""
    import hostlist

    if text is None:
        return []
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as e:
        raise SpecError(f"{flag} {text!r}: not a Slurm hostlist ({e}); e.g. n[1-3],gpu07") from None
    if not names:
        raise SpecError(f"{flag} {text!r}: names no node; e.g. n[1-3],gpu07")
    bad = next((n for n in names if not NODE_NAME_RE.match(n)), None)
    if bad is not None:
        raise SpecError(f"{flag} {text!r}: {bad!r} is not a node name (letters, digits, '.', '_' and '-')")
    return names


def node_lists(
    nodes: int, nodelist: Optional[str], exclude: Optional[str], spares: int = 0
) -> tuple[Optional[str], Optional[str]]:
    """--nodelist and --exclude checked against each other and --nodes (and the spare nodes), as compressed hostlists
    (None when not given)."""
    import hostlist

    wanted, avoided = parse_nodes("--nodelist", nodelist), parse_nodes("--exclude", exclude)
    if len(set(wanted)) > nodes + spares:
        if spares:
            raise SpecError(
                f"--nodelist {nodelist!r} names {len(set(wanted))} nodes; --nodes {nodes} + {spares} spare(s): "
                f"list at most {nodes + spares} nodes"
            )
        raise SpecError(
            f"--nodelist {nodelist!r} names {len(set(wanted))} nodes; --nodes {nodes}: list at most --nodes nodes"
        )
    both = sorted(set(wanted) & set(avoided))
    if both:
        raise SpecError(
            f"--nodelist and --exclude both name {hostlist.collect_hostlist(both)}: a node is either wanted or excluded"
        )
    return (
        hostlist.collect_hostlist(wanted) if wanted else None,
        hostlist.collect_hostlist(avoided) if avoided else None,
    )


def site_path(text: str, workdir: Path, key: str) -> Path:
    """A profile path (``key``) with ~ and $VARS expanded ($USER is the user's name even where the environment lacks
    it), made absolute against the submit directory; a variable that is not set is a SpecError."""
    env = {"USER": getpass.getuser(), **os.environ}

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise SpecError(f"{key}: {shown(text)} uses ${name}, which is not set in this environment")
        return env[name]

    path = Path(re.sub(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))", value, os.path.expanduser(text)))
    return path if path.is_absolute() else workdir / path


def rank_program(
    args: Sequence[str], site: SiteProfile, job_dir: Path, checkpoint_dir: Path
) -> tuple[Optional[TrainerJob], tuple[str, ...]]:
    """What every rank runs: the trainer (its part of the job, as data) or, after ``python -u``, a script (`x.py ARGS`)
    or a module (`-m MOD ARGS`)."""
    args = list(args)
    if runs_trainer(args):
        return trainer_job(args, site, job_dir, checkpoint_dir), ()
    if args[0] == "-m":
        if len(args) < 2:
            raise SpecError("-- -m needs a module name, e.g. -- -m hpc.node.smoke")
        return None, tuple(args)
    if not Path(args[0]).is_file():
        raise SpecError(f"script {args[0]} does not exist")
    return None, (str(Path(args[0]).resolve()), *args[1:])


def config_key_problem(key: str) -> Optional[str]:
    """Why ``key`` (a.b.c) is not a key of the training config, or None (a key below a mapping is left to
    validation)."""
    from pydantic import BaseModel

    model, parts = TrainConfig, key.split(".")
    for i, part in enumerate(parts):
        if part not in model.model_fields:
            return f"not a config key ({'.'.join(parts[:i]) or 'the top level'} has: {', '.join(model.model_fields)})"
        ann = model.model_fields[part].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
            continue
        plain_value = isinstance(ann, type) and not issubclass(ann, dict)
        return f"{'.'.join(parts[: i + 1])} is a value, not a section" if plain_value and i < len(parts) - 1 else None
    return f"{key} is a section, not a value: sweep one of its keys ({', '.join(model.model_fields)})"


def plan_trainer(spec: JobSpec) -> tuple[JobSpec, Optional[TrainConfig], Optional[str]]:
    """The trainer's config loaded (once per submit) and the planner's layout added to the trainer's part where it adds
    one: returns the spec, the config as the ranks will load it (None for a script or module) and the planner's note."""
    if spec.trainer is None:
        return spec, None, None
    try:
        cfg = spec.trainer.load()
    except ConfigError as e:
        raise SpecError(f"trainer: {e}") from None
    layout, note = plan_layout(cfg, spec.partition, spec.nodes, spec.gpus_per_node)
    if layout is None:
        return spec, cfg, None
    return dataclasses.replace(spec, trainer=dataclasses.replace(spec.trainer, layout=layout)), layout.apply(cfg), note


def check_rank_command(spec: JobSpec, cfg: Optional[TrainConfig] = None) -> None:
    """What every rank will run, checked here before anything is submitted: the trainer's config, files and layout for
    this job's ranks (the trainer's own first check, train.front.run_check; ``cfg``: the job's config already loaded)
    and the owners of its directories, or that a ``-m MODULE`` exists for the job's python."""
    cmd = spec.command
    if spec.runs_trainer:
        for key in spec.sweep.keys if spec.sweep is not None else ():
            problem = config_key_problem(key)
            if problem:
                raise SpecError(f"--sweep {key}: {problem}")
        env = WorldEnv(rank=0, local_rank=0, world_size=spec.world_size, local_world_size=spec.gpus_per_node)
        tasks = (
            [(spec.job_name, ())]
            if spec.sweep is None
            else [(t.owner(spec.job_name), task_args(t, spec.job_dir, spec.checkpoint_dir)) for t in spec.sweep.tasks]
        )
        for owner, overrides in tasks:
            where = "trainer" if spec.sweep is None else f"--sweep task {owner.removeprefix(spec.job_name)}: trainer"
            try:
                task_cfg = cfg if cfg is not None and spec.sweep is None else spec.trainer.load(overrides)
                check_run(task_cfg, env)
                check_owner(task_cfg.log.dir, owner, LOG_DIR_KEY)
                check_owner(task_cfg.checkpoint_dir, owner, CHECKPOINT_DIR_KEY)
            except HpcError as e:
                raise SpecError(f"{where}: {e}") from None
    elif cmd[2] == "-m" and Path(cmd[0]).is_file():  # the rank's python (a name inside an image is not checked here)
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
        try:
            missing = run_tool([cmd[0], "-c", probe, cmd[3]], PROBE_TIMEOUT_S, cwd=spec.workdir).returncode != 0
        except OSError as e:
            raise SpecError(f"python {cmd[0]}: cannot run it ({e.strerror or e})") from None
        if missing:
            raise SpecError(f"-m {cmd[3]}: no such module for {cmd[0]} (run from {spec.workdir})")


def check_gpu_partition(site: SiteProfile, part: Partition, flag: str) -> None:
    """A SpecError naming ``flag`` when ``part`` has no GPUs: the GPU health checks need a GPU partition."""
    if part.gpu_request == "none":
        gpu = [p.name for p in site.partitions if p.gpu_request != "none"]
        raise SpecError(
            f"{flag}: partition {part.name} of site {site.name} has no GPUs (gpu_request: none); the GPU health checks "
            f"need a GPU partition: {', '.join(gpu) if gpu else 'the site has none'}"
        )


def build_spec(
    site: SiteProfile,
    nodes: int,
    partition: Optional[str] = None,
    gpus_per_node: Optional[int] = None,
    time: Optional[str] = None,
    job_name: Optional[str] = None,
    launcher: str = SRUN.name,
    args: Sequence[str] = (),
    workdir: Optional[Path] = None,
    python: Optional[str] = None,
    signal: Optional[str] = None,
    signal_lead_s: Optional[int] = None,
    max_requeues: Optional[int] = None,
    container_image: Optional[str] = None,
    sweep: Sequence[str] = (),
    max_parallel: Optional[int] = None,
    after: Sequence[str] = (),
    nodelist: Optional[str] = None,
    exclude: Optional[str] = None,
    preflight: bool = False,
    spare_nodes: Optional[int] = None,
) -> JobSpec:
    """Check the request against the site profile; every problem is one `SpecError` line."""
    try:
        part = site.partition(partition)
    except SiteError as e:
        raise SpecError(f"--partition: {e}") from None
    if nodes < 1:
        raise SpecError(f"--nodes {nodes}: must be at least 1")
    if nodes > part.max_nodes:
        raise SpecError(
            f"--nodes {nodes}: partition {part.name} of site {site.name} has at most {part.max_nodes} nodes"
        )
    spares = site.restart.spare_nodes if spare_nodes is None else spare_nodes
    if spares and nodes + spares > part.max_nodes:
        given = (
            f"--spare-nodes {spares}" if spare_nodes is not None else f"site {site.name}: restart.spare_nodes {spares}"
        )
        raise SpecError(
            f"{given}: --nodes {nodes} + {spares} spare(s) is {nodes + spares} nodes; partition {part.name} of "
            f"site {site.name} has at most {part.max_nodes}"
        )
    gpus = part.gpus_per_node if gpus_per_node is None else gpus_per_node
    if not 1 <= gpus <= part.gpus_per_node:
        raise SpecError(f"--gpus-per-node {gpus}: partition {part.name} allows 1 to {part.gpus_per_node}")
    if preflight:
        check_gpu_partition(site, part, "--preflight")
    launch = get_launcher(launcher)
    if part.gpu_bind and not launch.per_node:
        try:
            check_job_bind(part.gpu_bind, gpus, launch.tasks_per_node(gpus))
        except ValueError as e:
            raise SpecError(f"--gpus-per-node {gpus}: partition {part.name}'s {e}") from None
    limit = part.max_minutes
    if time is None:
        minutes = limit if limit is not None else 60
    else:
        try:
            minutes = parse_minutes(time)
        except ValueError as e:
            raise SpecError(f"--time: {e}") from None
        if minutes is None:
            if limit is not None:
                raise SpecError(
                    f"--time {time}: partition {part.name} allows at most {part.max_time} ({format_minutes(limit)})"
                )
            minutes = 60 * 24 * 365
        if limit is not None and minutes > limit:
            raise SpecError(
                f"--time {time}: partition {part.name} allows at most {part.max_time} ({format_minutes(limit)})"
            )
    name = job_name if job_name is not None else "train"
    if not name.strip() or any(ord(c) < 32 or c == "\x7f" for c in name):
        raise SpecError("--job-name: must be one non-empty line of printable characters")
    if "\\" in name:
        raise SpecError(
            "--job-name: a backslash cannot be given to Slurm exactly (#SBATCH lines drop it); leave it out"
        )
    if len(name) > MAX_JOB_NAME:
        raise SpecError(f"--job-name: {len(name)} characters; at most {MAX_JOB_NAME}")
    try:
        pre = Preemption(
            signal=signal or site.preemption.signal,
            lead_s=site.preemption.lead_s if signal_lead_s is None else signal_lead_s,
            max_requeues=site.preemption.max_requeues if max_requeues is None else max_requeues,
        )
    except ValidationError as e:
        err = e.errors()[0]
        flag = {"signal": "--signal", "lead_s": "--signal-lead", "max_requeues": "--max-requeues"}[err["loc"][0]]
        raise SpecError(f"{flag}: {err['msg'].removeprefix('Value error, ')}") from None
    if pre.lead_s >= minutes * 60:
        raise SpecError(f"--signal-lead {pre.lead_s}: must be shorter than the time limit ({minutes * 60} s)")
    wanted, avoided = node_lists(nodes, nodelist, exclude, spares)
    array = build_sweep(sweep, max_parallel, site.submission.max_array_size)
    dependencies = parse_after(after)
    workdir = (workdir or Path.cwd()).resolve()
    python = python or site.environment.python or sys.executable
    job_dir = site_path(site.paths.job_dir, workdir, "paths.job_dir") / run_dir_name(name)
    checkpoint_dir = site_path(site.paths.checkpoint_root, workdir, "paths.checkpoint_root") / run_dir_name(name)
    container = job_container(site, part, container_image)
    trainer, program = rank_program(args, site, job_dir, checkpoint_dir)
    spec = JobSpec(
        site=site,
        partition=part,
        nodes=nodes,
        gpus_per_node=gpus,
        minutes=minutes,
        job_name=name,
        launcher=launch,
        program=program,
        trainer=trainer,
        job_dir=job_dir,
        checkpoint_dir=checkpoint_dir,
        workdir=workdir,
        python=python,
        signal=pre.signal,
        signal_lead_s=pre.lead_s,
        max_requeues=pre.max_requeues,
        container=container,
        sweep=array,
        after=dependencies,
        nodelist=wanted,
        exclude=avoided,
        preflight=preflight,
        spare_nodes=spares,
    )
    if array is not None and not spec.runs_trainer:
        raise SpecError(f"--sweep: sweeps trainer overrides; {' '.join(spec.command[2:4])} is not the trainer")
    if container:
        try:
            spec.places.check()
        except ValueError as e:
            raise SpecError(f"container: {e}") from None
    return spec


def job_container(site: SiteProfile, part: Partition, image: Optional[str]) -> Optional[Container]:
    """The partition's (else the site's) container, with ``--container IMAGE`` as its image when given."""
    container = site.container_for(part)
    if image is None:
        return container
    if container is None:
        raise SpecError(
            f"--container {image}: site {site.name} has no container section for partition {part.name} "
            "(add container: with a runtime to the profile)"
        )
    try:
        return container.with_image(image)
    except ValueError as e:
        raise SpecError(f"--container {image}: {e}") from None
