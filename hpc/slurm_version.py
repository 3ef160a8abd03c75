"""The Slurm version a job is submitted to (its sbatch's, at submit time), and the profile options it is too old for.

What the job's inner sruns see differs between versions, and the rendered script is the same on all of them: the
ranks' srun names its --cpus-per-task (22.05 to 23.02 stopped reading SLURM_CPUS_PER_TASK, 23.11 reads it again), and
no inner srun names a GPU option other than the job's (26.05 refuses --gpus-per-node with --gres=gpu, even with the
first inherited from SLURM_GPUS_PER_NODE). What cannot be the same is refused here, before anything is written: a
--gres-flags value the cluster's Slurm does not know.
"""

from __future__ import annotations

import re
from typing import Optional

from hpc.node.tool import run_tool
from hpc.spec import JobSpec, SpecError

Version = tuple[int, int]
# --gres-flags values and the first Slurm release that takes them (22.05 refuses each as an invalid specification)
GRES_FLAG_SINCE: dict[str, Version] = {
    "allow-task-sharing": (23, 11),
    "one-task-per-sharing": (24, 5),
    "multiple-tasks-per-sharing": (24, 5),
}
_VERSION_RE = re.compile(r"^slurm(?:-wlm)?\s+(\d+)\.(\d+)(?:\.\d+)?", re.M)


def parse_version(text: str) -> Optional[Version]:
    """(major, minor) of a ``--version`` line (``slurm 23.11.4``, ``slurm-wlm 24.11.5``); None if there is none."""
    m = _VERSION_RE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def shown_version(version: Version) -> str:
    return f"{version[0]}.{version[1]:02d}"


def sbatch_version() -> Optional[Version]:
    """The version of the sbatch on PATH (the cluster's, as a login node has it); None when it does not say."""
    try:
        r = run_tool(["sbatch", "--version"], timeout_s=30)
    except OSError:  # ToolMissing, ToolTimeout
        return None
    return parse_version(r.stdout) if r.returncode == 0 else None


def check_version(spec: JobSpec, version: Optional[Version]) -> None:
    """Refuse (SpecError) a partition option that the cluster's Slurm ``version`` does not take."""
    if version is None:
        return
    part = spec.partition
    for flag in part.gres_flags:
        since = GRES_FLAG_SINCE.get(flag)
        if since and version < since:
            raise SpecError(
                f"partitions[{part.name}].gres_flags: {flag} needs Slurm {shown_version(since)} or newer; this cluster "
                f"runs {shown_version(version)}: remove it (allowed here: "
                f"{', '.join(f for f, s in GRES_FLAG_SINCE.items() if version >= s) or 'no sharing flags'}, "
                "enforce-binding, disable-binding)"
            )
