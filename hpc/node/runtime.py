"""The node's python, project version and torch build against those the login node rendered the job for (the
HPC_EXPECT_* variables of the batch script), checked by hpc.node.launch in the first seconds of every job and of the
preflight: a node whose PATH finds another python first (a ~/.local torchrun, another venv) fails at once, naming
what differs, instead of every rank failing later with ModuleNotFoundError or a different build.

Versions come from the installed distributions' metadata (importlib.metadata), so nothing here imports torch."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Mapping, Optional

from hpc.node.cli import NodeCheckError
from hpc.node.contract import EXPECT_PROJECT_VAR, EXPECT_PYTHON_VAR, EXPECT_TORCH_VAR, PROJECT_DIST


def installed(dist: str) -> Optional[str]:
    """A distribution's installed version, None when it is not installed (e.g. a checkout on PYTHONPATH)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def runtime() -> dict[str, Optional[str]]:
    """This interpreter's python version, the project's and torch's installed versions, by their variables."""
    return {
        EXPECT_PYTHON_VAR: platform.python_version(),
        EXPECT_PROJECT_VAR: installed(PROJECT_DIST),
        EXPECT_TORCH_VAR: installed("torch"),
    }


NAMES = {EXPECT_PYTHON_VAR: "python", EXPECT_PROJECT_VAR: PROJECT_DIST, EXPECT_TORCH_VAR: "torch"}


def check_runtime(environ: Mapping[str, str], here: Optional[dict[str, Optional[str]]] = None) -> str:
    """Compare this node with the versions the job was rendered for (each variable that is set); a summary, or a
    NodeCheckError naming every difference and the interpreter that runs here."""
    here = runtime() if here is None else here
    wanted = {var: environ[var] for var in NAMES if environ.get(var)}
    differ = [
        f"{NAMES[var]} {here[var] or 'not installed'} (rendered for {want})"
        for var, want in wanted.items()
        if here[var] != want
    ]
    if differ:
        raise NodeCheckError(
            f"this node runs {'; '.join(differ)} with {sys.executable}: another python, venv or "
            "~/.local install comes first here than on the login node (environment.setup or "
            "environment.python in the profile)"
        )
    return ", ".join(f"{NAMES[var]} {here[var]}" for var in wanted) or "no HPC_EXPECT_* set: nothing to compare"
