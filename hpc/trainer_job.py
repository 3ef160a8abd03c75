"""The trainer's part of a job, as data: its config file, the user's overrides, the planner's layout and the run's
directories. ``trainer_job`` builds it from the words after ``--``; ``args`` is what every rank gives
``python -m train`` (an array task adds its own overrides), and ``load`` reads the config from exactly those."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hpc.node.cli import HpcError, shown
from hpc.node.contract import TRAINER_MODULE
from hpc.site import SiteProfile
from train.front.config import ConfigError, TrainConfig, load_config, split_cli
from train.front.interface import CHECKPOINT_DIR_KEY, CONFIG_DIR, LOG_DIR_KEY, STRAGGLER_STOP_KEY
from train.front.layout import Layout, ParallelDims, WorldEnv


@dataclass(frozen=True)
class TrainerJob:
    config: str  # the YAML file
    overrides: tuple[str, ...] = ()  # the user's key.sub=value overrides, in their order
    run_dirs: tuple[
        tuple[str, Path], ...
    ] = ()  # (log.dir or checkpoint.dir, the job's directory) unless the user set it
    layout: Optional[Layout] = None  # the planner's choice, where it made one
    site_settings: tuple[tuple[str, str], ...] = ()  # (key, value) the profile sets unless the user did

    def args(self, task_overrides: Sequence[str] = ()) -> list[str]:
        """The trainer's command line: the config, the user's overrides, the planner's, the run's directories, the
        task's."""
        layout = self.layout.overrides() if self.layout else []
        return [
            "--config",
            self.config,
            *self.overrides,
            *layout,
            *(f"{key}={path}" for key, path in self.run_dirs),
            *(f"{key}={value}" for key, value in self.site_settings),
            *task_overrides,
        ]

    def load(self, task_overrides: Sequence[str] = ()) -> TrainConfig:
        """The config as the ranks will load it; raises ConfigError (one line)."""
        return load_config(self.config, self.args(task_overrides)[2:])


def runs_trainer(args: Sequence[str]) -> bool:
    """Whether the words after ``--`` run the trainer: anything but a script (``x.py ARGS``) or another ``-m
    TRAINER_MODULE``."""
    if args and args[0] == "-m":
        return list(args[1:2]) == [TRAINER_MODULE]
    return not (args and args[0].endswith(".py"))


def default_train_config(site: SiteProfile) -> str:
    """The profile's training.config as a file (a name in train/configs/ or a path), checked to exist."""
    name = site.training.config
    path = Path(name) if name.endswith((".yaml", ".yml")) or "/" in name else CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        raise HpcError(
            f"site {site.name}: training.config {shown(name)}: {path} does not exist (names in train/configs: {known})"
        )
    return str(path)


def trainer_job(args: Sequence[str], site: SiteProfile, job_dir: Path, checkpoint_dir: Path) -> TrainerJob:
    """The trainer's part from the words after ``--`` (``-m train`` may lead them): ``--config FILE`` (default: the
    profile's training.config) and overrides. The trainer logs into the job directory and checkpoints under the site's
    checkpoint root, both named after the job (unless an override sets them): a job of the same name resumes the same
    run.
    With the profile's preemption.exclude_stragglers_after it stops for a persistent straggler
    (straggler.stop_after)."""
    args = list(args[2:] if args[:1] == ["-m"] else args)
    try:
        config, overrides = split_cli(args)
    except ConfigError as e:
        raise HpcError(f"trainer: {e}") from None
    run_dirs = tuple(
        (key, path)
        for key, path in ((LOG_DIR_KEY, job_dir), (CHECKPOINT_DIR_KEY, checkpoint_dir))
        if not any(o.startswith(f"{key}=") for o in overrides)
    )
    after = site.preemption.exclude_stragglers_after  # stop for a persistent straggler, to requeue without its node
    site_settings = tuple(
        (key, str(value))
        for key, value in ((STRAGGLER_STOP_KEY, after),)
        if value and not any(o.startswith(f"{key}=") for o in overrides)
    )
    return TrainerJob(config or default_train_config(site), tuple(overrides), run_dirs, site_settings=site_settings)


def batch_note(cfg: TrainConfig, world_size: int, ranks_per_node: int) -> Optional[str]:
    """The note for a global batch that does not split evenly over the job's dp ranks (train/front/batch_split.py), or
    None; ``cfg`` already passed ``train.run_check``."""
    env = WorldEnv(rank=0, local_rank=0, world_size=world_size, local_world_size=ranks_per_node)
    dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads(), num_experts=cfg.model.num_experts())
    return dims.batch_split(cfg.global_batch, cfg.micro_batch).uneven_note()
