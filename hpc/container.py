"""The profile's `container:` section (pyxis, apptainer/singularity, or a command prefix) and what it renders:
pyxis options for srun, or the argv prefix that `hpc.node.launch` runs the rank command behind."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpc.node.cli import shown

# runtimes whose wrapper hpc.node.launch runs on the host, with the rank command behind it; pyxis: srun enters the image
WRAPPED = ("apptainer", "singularity", "command")
PLACEHOLDERS = ("image", "workdir", "project", "job_dir", "checkpoint_dir")
MOUNT_RE = re.compile(r"^(/[^:,\n]*):(/[^:,\n]*)(:ro)?$")


def _placeholders(item: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(item) if name is not None}
    except ValueError as e:
        raise ValueError(f"command item {shown(item)}: {e} (write {{{{ and }}}} for literal braces)") from None


def is_local_image(image: str) -> bool:
    """A file on the nodes (e.g. a .sif), not a URI such as docker:// or library://."""
    return "://" not in image


class Container(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    runtime: Literal["pyxis", "apptainer", "singularity", "command"]
    image: Optional[str] = Field(None, pattern=r"^[^\n\r]+$")
    mounts: list[str] = Field(default_factory=list, description="SRC:DST[:ro], absolute paths")
    command: list[str] = Field(
        default_factory=list, description="runtime command: the prefix, with {image}-like placeholders"
    )
    python: str = Field("python", pattern=r"^\S+$", description="python inside the image that runs the rank command")
    project: Literal["mount", "installed"] = "mount"

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            if not MOUNT_RE.fullmatch(m):
                raise ValueError(f"mount {shown(m)} is not SRC:DST or SRC:DST:ro with absolute paths (no commas)")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        for item in v:
            if "\n" in item or "\r" in item:
                raise ValueError(f"command item {shown(item)} must be one line")
            unknown = _placeholders(item) - set(PLACEHOLDERS)
            if unknown:
                raise ValueError(
                    f"command item {shown(item)}: unknown placeholder {{{sorted(unknown)[0]}}}; allowed: "
                    + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Container":
        if self.runtime == "command":
            if not self.command:
                raise ValueError(
                    "runtime command needs command: the prefix as a list, e.g. [bwrap, --dev-bind, /, /, --]"
                )
            if self.mounts:
                raise ValueError("runtime command takes no mounts: bind them in command")
            if self.image is None and any("image" in _placeholders(i) for i in self.command):
                raise ValueError("command uses {image} but image is not given")
        else:
            if self.command:
                raise ValueError(f"command is the prefix of runtime command; runtime {self.runtime} renders its own")
            if self.image is None:
                raise ValueError(f"runtime {self.runtime} needs image")
        check_image(self.runtime, self.image)
        return self

    def with_image(self, image: str) -> "Container":
        """This section with another image (``--container IMAGE``), checked as the profile's would be."""
        if self.runtime == "command" and not any("image" in _placeholders(i) for i in self.command):
            raise ValueError("runtime command of this profile has no {image} in its command, so an image has no place")
        if not image.strip() or "\n" in image or "\r" in image:
            raise ValueError("the image must be one non-empty line")
        check_image(self.runtime, image)
        return self.model_copy(update={"image": image})

    @property
    def wrapped(self) -> bool:
        """Whether hpc.node.launch runs on the host with the runtime's command as its child (else srun enters the
        image)."""
        return self.runtime in WRAPPED

    def binds(self, places: "Places") -> list[str]:
        """Every mount: the job's own directories (and the project when mounted) at the same path, then the
        profile's."""
        paths = [
            places.workdir,
            places.job_dir,
            places.checkpoint_dir,
            *([places.project] if self.project == "mount" else []),
        ]
        own = [f"{p}:{p}" for p in dict.fromkeys(str(p) for p in paths)]
        return own + [m for m in self.mounts if m not in own]

    def srun_options(self, places: "Places") -> list[str]:
        """pyxis: the srun options that run every task inside the image."""
        opts = [
            f"--container-image={self.image}",
            f"--container-mounts={','.join(self.binds(places))}",
            f"--container-workdir={places.workdir}",
            "--no-container-mount-home",
        ]
        if self.project == "mount":
            opts.append("--container-env=PYTHONPATH")
        return opts

    def prefix(self, places: "Places") -> list[str]:
        """apptainer/singularity/command: the argv that the rank command runs behind."""
        if self.runtime == "command":
            values = {
                "image": self.image or "",
                "workdir": places.workdir,
                "project": places.project,
                "job_dir": places.job_dir,
                "checkpoint_dir": places.checkpoint_dir,
            }
            return [item.format(**values) for item in self.command]
        argv = [self.runtime, "exec", "--nv", "--pwd", str(places.workdir)]
        for bind in self.binds(places):
            argv += ["--bind", bind]
        if self.project == "mount":
            argv += ["--env", f"PYTHONPATH={places.project}"]
        return [*argv, str(self.image)]


@dataclass(frozen=True)
class Places:
    """The job's directories, which every runtime sees at the same path as the host."""

    workdir: Path
    job_dir: Path
    checkpoint_dir: Path
    project: Path

    def check(self) -> None:
        """A directory that a mount list cannot carry (pyxis and apptainer split on , and :) is a ValueError."""
        for name, path in (
            ("the submit directory", self.workdir),
            ("the job directory", self.job_dir),
            ("the checkpoint directory", self.checkpoint_dir),
            ("the project directory", self.project),
        ):
            if re.search(r"[,:\n]", str(path)):
                raise ValueError(f"{name} {path} has a comma, colon or newline, which a container mount cannot carry")


def check_image(runtime: str, image: Optional[str]) -> None:
    """apptainer/singularity: a local image file must exist (pyxis and URIs are resolved on the nodes)."""
    if runtime in ("apptainer", "singularity") and image and is_local_image(image) and not Path(image).is_file():
        raise ValueError(f"image {image} does not exist (a local .sif file, or a URI such as docker://...)")
