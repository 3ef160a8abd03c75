"""The job's environment, merged in one place from where each variable is set: the network keys (`hpc.network`), the
network's ``extra_env``, the profile's ``environment.variables`` and what ``hpc.submit`` sets for the job itself. A
variable set in two places is refused, naming both (no value wins silently); the profile's are checked when it is
loaded, so a bad profile is one line before anything is rendered."""

from __future__ import annotations

from typing import Mapping, Optional

from hpc.network import Network, Settings, network_settings
from hpc.node.contract import (
    EXPECT_PROJECT_VAR,
    EXPECT_PYTHON_VAR,
    EXPECT_TORCH_VAR,
    JOB_DIR_VAR,
    JOB_NAME_VAR,
    MAX_REQUEUES_VAR,
    STOP_SIGNAL_VAR,
)

SUBMIT = "hpc.submit"
# what hpc.submit exports for every job (render.job_env), whatever the profile says
JOB_VARS = (
    "OMP_NUM_THREADS",
    JOB_NAME_VAR,
    JOB_DIR_VAR,
    STOP_SIGNAL_VAR,
    MAX_REQUEUES_VAR,
    EXPECT_PYTHON_VAR,
    EXPECT_PROJECT_VAR,
    EXPECT_TORCH_VAR,
)


def merge(settings: Settings) -> dict[str, str]:
    """The variables of ``settings`` in order, without the owned-but-unset (None); ValueError naming both places when
    a variable comes from two."""
    where: dict[str, str] = {}
    out: dict[str, str] = {}
    for source, variables in settings:
        for name, value in variables.items():
            if name in where and where[name] != source:
                raise ValueError(
                    f"{name} is set by {where[name]} and in {source}: one setting, one place (remove it from {source})"
                )
            where[name] = source
            if value is not None:
                out[name] = value
    return out


def profile_settings(network: Network, variables: Mapping[str, str], mounted: bool) -> Settings:
    """The profile's variables by where they are set (its network section, its ``environment.variables``), and the
    job's own (owned by hpc.submit; PYTHONPATH too where a container mounts the project) before them."""
    own = dict.fromkeys(JOB_VARS + (("PYTHONPATH",) if mounted else ()))
    return [
        (SUBMIT, own),
        *network_settings(network),
        ("environment.variables", dict(variables)),
    ]


def check_profile_env(network: Network, variables: Mapping[str, str], mounted: bool) -> None:
    """ValueError (one line) when the profile sets a variable in two places or one that hpc.submit sets."""
    merge(profile_settings(network, variables, mounted))


def job_env(
    network: Network, variables: Mapping[str, str], mounted: bool, job: dict[str, Optional[str]]
) -> dict[str, str]:
    """Every variable the job's script exports: network first, then the profile's, then the job's (``job``, owned by
    hpc.submit: None leaves one unset)."""
    settings = profile_settings(network, variables, mounted)[1:] + [(SUBMIT, job)]
    return merge(settings)
