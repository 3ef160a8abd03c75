"""Site profiles: one YAML file per cluster, validated into `SiteProfile`.

Lookup for ``--site NAME`` (first hit wins):
  1. a path, when NAME ends in .yaml/.yml or contains a slash;
  2. each directory in ``$HPC_SITE_DIRS`` (colon-separated);
  3. ``./NAME.yaml`` in the working directory;
  4. ``$XDG_CONFIG_HOME/hpc/sites/NAME.yaml`` (default ``~/.config/hpc/sites/``: the user's own profiles);
  5. the profiles shipped in the package, ``site_configs/NAME.yaml``.
docs/sites.md describes the keys.
Unknown keys are errors, so a typo never passes silently.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_validator

from hpc.container import Container
from hpc.gpu_binding import check_partition_bind
from hpc.gpu_request import GpuRequest, check_cpu_bind, check_gpu_bind, check_gres_flags
from hpc.job_env import check_profile_env
from hpc.network import Network
from hpc.node.cli import HpcError, shown
from hpc.node.contract import (
    DEFAULT_MAX_EXCLUDED_NODES,
    DEFAULT_MAX_REQUEUES,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MAX_RESTARTS_PER_NODE,
    DEFAULT_SIGNAL_LEAD_S,
    DEFAULT_STOP_SIGNAL,
    MAX_COUNT,
    MAX_GPUS_PER_NODE,
    MAX_SIGNAL_LEAD_S,
    SITE_DIRS_VAR,
    STOP_SIGNALS,
)
from hpc.node.files import META_BYTES, NotASmallFile, read_small_text
from hpc.node.strict_yaml import YamlError, load_yaml
from hpc.profile_base import ONE_LINE_RE, Strict, shell_names
from hpc.sbatch_options import check_extra_sbatch
from hpc.shipped import SHIPPED_SITE_DIR
from hpc.slurm_time import parse_minutes
from hpc.sweep import DEFAULT_MAX_ARRAY_SIZE, MAX_ARRAY_SIZE

NAME_RE = r"^[A-Za-z0-9._-]+$"  # pydantic patterns: $ is the end of the text (no newline before it)


class SiteError(HpcError):
    """A profile that cannot be found or does not validate; the message is one line."""


class Submission(Strict):
    account: Optional[str] = Field(None, pattern=ONE_LINE_RE)
    qos: Optional[str] = Field(None, pattern=ONE_LINE_RE)
    slurm_conf: Optional[str] = Field(None, description="SLURM_CONF for this site's client commands")
    max_array_size: int = Field(
        DEFAULT_MAX_ARRAY_SIZE, ge=1, le=MAX_ARRAY_SIZE, description="the cluster's MaxArraySize (tasks of a sweep)"
    )
    extra_sbatch: dict[str, Union[str, bool]] = Field(
        default_factory=dict, description="more #SBATCH options, e.g. constraint (true: a flag without a value)"
    )

    @field_validator("extra_sbatch")
    @classmethod
    def _options(cls, v: dict[str, Union[str, bool]]) -> dict[str, Union[str, bool]]:
        for key, value in v.items():
            if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
                raise ValueError(
                    f"{shown(key)} is not an sbatch long option (lower-case letters, digits and -, without the leading "
                    "--)"
                )
            if not re.fullmatch(ONE_LINE_RE, str(value)):
                raise ValueError(f"the value of {shown(key)} must be one line")
        return check_extra_sbatch(v)


class Partition(Strict):
    name: str = Field(pattern=NAME_RE, max_length=200)
    default: bool = False
    max_nodes: int = Field(ge=1, le=MAX_COUNT)
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    gpu_type: Optional[str] = Field(None, pattern=NAME_RE, max_length=200)
    gpu_memory_gb: Optional[float] = Field(None, gt=0)
    cpus_per_node: int = Field(ge=1, le=65534, description="CPUs of a node (Slurm keeps --cpus-per-task in 16 bits)")
    mem_per_node_gb: Optional[int] = Field(
        None, ge=1, le=2**31, description="whole GB (sbatch --mem=NG; 0 would mean the whole node)"
    )
    max_time: str = "UNLIMITED"
    matmul_tflops: Optional[float] = Field(
        None, gt=0, description="expected bf16 matmul TFLOP/s of one GPU (hpc.node.health)"
    )
    copy_gbps: Optional[float] = Field(
        None, gt=0, description="expected device copy GB/s (read + written) of one GPU (hpc.node.health)"
    )
    container: Optional[Container] = Field(None, description="this partition's container; replaces the site's")
    gpu_request: GpuRequest = Field(
        "gpus-per-node",
        description="how the job asks for GPUs: gpus-per-node "
        "(--gpus-per-node=[TYPE:]N), gres (--gres=gpu[:TYPE]:N), gpus (--gpus=[TYPE:]TOTAL with "
        "--ntasks-per-node) or none (a CPU partition: gpus_per_node is then the ranks per node)",
    )
    gpu_bind: Optional[str] = Field(
        None,
        description="srun --gpu-bind of the ranks, e.g. closest or map_gpu:0,1,2,3 (each rank then sees only its GPUs)",
    )
    cpu_bind: Optional[str] = Field(None, description="srun --cpu-bind of every step, e.g. none")
    gres_flags: list[str] = Field(
        default_factory=list,
        description="--gres-flags: allow-task-sharing on the ranks' srun "
        "(with gpu_bind, so NCCL still reaches the node's other GPUs), the others on the job",
    )

    @field_validator("gpu_bind")
    @classmethod
    def _gpu_bind(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else check_gpu_bind(v)

    @field_validator("cpu_bind")
    @classmethod
    def _cpu_bind(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else check_cpu_bind(v)

    @field_validator("gres_flags")
    @classmethod
    def _gres_flags(cls, v: list[str]) -> list[str]:
        return check_gres_flags(v)

    @model_validator(mode="after")
    def _bind_on_node(self) -> "Partition":
        if self.gpu_bind is not None:
            check_partition_bind(self.gpu_bind, self.gpus_per_node)
        return self

    @model_validator(mode="after")
    def _cpu_partition(self) -> "Partition":
        if self.gpu_request == "none":
            given = [
                k
                for k in ("gpu_type", "gpu_memory_gb", "matmul_tflops", "copy_gbps", "gpu_bind")
                if getattr(self, k) is not None
            ]
            given += ["gres_flags"] if self.gres_flags else []
            if given:
                raise ValueError(f"gpu_request none (a CPU partition) takes no {', '.join(given)}")
        return self

    @field_validator("max_time")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_minutes(v)
        return v

    @property
    def max_minutes(self) -> Optional[int]:
        return parse_minutes(self.max_time)


class Environment(Strict):
    modules: list[Annotated[str, Field(pattern=r"^\S+$")]] = Field(
        default_factory=list, description="module names, one per item"
    )
    variables: dict[str, str] = Field(default_factory=dict)
    setup: Optional[str] = Field(None, description="shell lines run before the launch, verbatim (e.g. activate a venv)")
    python: Optional[str] = Field(None, description="python on the nodes; default: the interpreter that submits")

    @field_validator("variables")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        shell_names(v, "environment.variables")
        return v


class Preemption(Strict):
    signal: str = Field(
        DEFAULT_STOP_SIGNAL, description="pre-stop signal Slurm sends every rank before the time limit or on preemption"
    )
    lead_s: int = Field(
        DEFAULT_SIGNAL_LEAD_S,
        ge=10,
        le=MAX_SIGNAL_LEAD_S,
        description="seconds before the time limit the signal comes (Slurm may send it up to 60 s earlier)",
    )
    max_requeues: int = Field(
        DEFAULT_MAX_REQUEUES, ge=0, le=MAX_COUNT, description="requeues after which a stopped job ends instead"
    )
    max_excluded_nodes: int = Field(
        DEFAULT_MAX_EXCLUDED_NODES,
        ge=0,
        le=MAX_COUNT,
        description="nodes a job with --preflight may exclude "
        "itself (a node failing its health check, missing at a collective timeout or a "
        "persistent straggler: requeued without it); 0: it ends instead",
    )
    exclude_stragglers_after: int = Field(
        0,
        ge=0,
        le=MAX_COUNT,
        description="the trainer's straggler.stop_after: a rank named a "
        "straggler for this many windows in a row has its node excluded (the run stops "
        "with a checkpoint and is requeued without it); 0: off (at least straggler.windows)",
    )

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        name = v.upper().removeprefix("SIG")
        if name not in STOP_SIGNALS:
            raise ValueError(
                f"signal {shown(v)} is not allowed; allowed: {', '.join(STOP_SIGNALS)} (USR2 by default: NCCL may use "
                "USR1)"
            )
        return name


class Restart(Strict):
    spare_nodes: int = Field(
        0,
        ge=0,
        le=MAX_COUNT,
        description="nodes allocated beyond --nodes, for in-job restarts (default of "
        "hpc.submit --spare-nodes; 0: none, a failure goes back to the queue)",
    )
    max_restarts: int = Field(
        DEFAULT_MAX_RESTARTS, ge=0, le=MAX_COUNT, description="in-job restarts per job (all its runs)"
    )
    max_restarts_per_node: int = Field(
        DEFAULT_MAX_RESTARTS_PER_NODE,
        ge=1,
        le=MAX_COUNT,
        description="in-job restarts one node's failures may cause before it leaves the job (1: at the first)",
    )


class Paths(Strict):
    job_dir: str = Field("./jobs", pattern=ONE_LINE_RE)
    checkpoint_root: str = Field("./checkpoints", pattern=ONE_LINE_RE)


class Training(Strict):
    config: str = Field("demo", description="default trainer config: a name in train/configs/ or a YAML path")


class SiteProfile(Strict):
    name: str = Field(pattern=NAME_RE, max_length=200)
    description: str = ""
    submission: Submission = Submission()
    partitions: list[Partition] = Field(min_length=1)
    network: Network
    environment: Environment = Environment()
    paths: Paths = Paths()
    preemption: Preemption = Preemption()
    restart: Restart = Restart()
    training: Training = Training()
    container: Optional[Container] = Field(None, description="the container every partition without its own runs in")

    @model_validator(mode="after")
    def _one_default(self) -> "SiteProfile":
        names = [p.name for p in self.partitions]
        if len(set(names)) != len(names):
            raise ValueError(f"partition names repeat: {names}")
        if sum(p.default for p in self.partitions) > 1:
            raise ValueError("more than one partition has default: true")
        check_profile_env(self.network, self.environment.variables, self.mounts_project())
        return self

    def mounts_project(self) -> bool:
        """Whether a container of the site or of a partition mounts the project (hpc.submit then sets PYTHONPATH)."""
        return any(
            c is not None and c.project == "mount" for c in (self.container, *(p.container for p in self.partitions))
        )

    def container_for(self, partition: Partition) -> Optional[Container]:
        """The partition's container section, else the site's (None: no container)."""
        return partition.container or self.container

    def partition(self, name: Optional[str]) -> Partition:
        """The named partition, or the default one (the first when none is marked)."""
        if name is None:
            return next((p for p in self.partitions if p.default), self.partitions[0])
        for p in self.partitions:
            if p.name == name:
                return p
        allowed = ", ".join(p.name for p in self.partitions)
        raise SiteError(f"site {self.name}: partition {shown(name)} is not in the profile; allowed: {allowed}")


def user_site_dir() -> Path:
    """The user's own profiles: ``$XDG_CONFIG_HOME/hpc/sites`` (default ``~/.config/hpc/sites``)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config").expanduser() / "hpc" / "sites"


def site_dirs() -> list[Path]:
    """Where ``--site NAME`` looks, in order: $HPC_SITE_DIRS, the working directory, the user's directory, the shipped
    ones."""
    dirs = [Path(d).expanduser() for d in os.environ.get(SITE_DIRS_VAR, "").split(":") if d]
    return dirs + [Path.cwd(), user_site_dir(), SHIPPED_SITE_DIR]


def find_site(name: str) -> Path:
    if len(name) > 4096 or "\0" in name:
        raise SiteError(f"site {shown(name)}: not a profile name or path")
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name).expanduser()
        if path.is_dir():
            raise SiteError(f"site profile {name} is a directory; give a YAML file or a profile name")
        if path.exists() and not path.is_file():  # a FIFO or a device: reading it could block
            raise SiteError(f"site profile {name} is not a regular file")
        if not path.is_file():
            raise SiteError(f"site profile file {name} does not exist")
        return path
    for d in site_dirs():
        path = d / f"{name}.yaml"
        if path.is_file():
            return path
    known = sorted({p.stem for d in site_dirs() if d.is_dir() for p in d.glob("*.yaml")})
    raise SiteError(
        f"site {shown(name)} not found in {', '.join(map(str, site_dirs()))}; known sites: {', '.join(known) or 'none'}"
    )


def read_text(path: Path) -> str:
    """A profile's text; an unreadable or binary file is one SiteError line."""
    try:
        return read_small_text(path, META_BYTES)
    except NotASmallFile as e:  # a FIFO, a device, a directory, a huge or binary file
        raise SiteError(str(e)) from None
    except OSError as e:
        raise SiteError(f"{path}: cannot read it ({e.strerror})") from None


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def load_site(name: str) -> SiteProfile:
    """Find and validate a site profile; every problem is one `SiteError` line naming the file and key."""
    path = find_site(name)
    try:
        data = load_yaml(read_text(path), str(path))
    except YamlError as e:
        raise SiteError(str(e)) from None
    if not isinstance(data, dict):
        raise SiteError(f"{path}: expected a mapping of keys at the top level")
    try:
        return SiteProfile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/sites.md for the keys)"
            if tuple(err["loc"]) == ("environment", "container"):
                msg = "moved: write a top-level container: section with runtime: pyxis, image and mounts"
        raise SiteError(f"{path}: {_loc(err['loc'])}: {msg}") from None


if __name__ == "__main__":  # python -m hpc.site init NAME: a profile written from the cluster (hpc/site_init.py)
    from hpc.site_init import main

    main()
