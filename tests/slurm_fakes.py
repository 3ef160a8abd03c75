"""Fake Slurm clients for tests without a cluster: `sbatch`, `squeue`, `scontrol`, `sacct` (and `srun`, which submitit
looks for) as small scripts first on PATH. Each records its argv (and sbatch the script it was handed) and answers
with the next of the outputs queued for it: real outputs recorded from the local cluster (tests/unit/data/slurm,
scripts/record_slurm_outputs.py) or sbatch's own lines."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import ROOT

RECORDED = ROOT / "tests" / "unit" / "data" / "slurm"
COMMANDS = ("sbatch", "squeue", "scontrol", "sacct", "srun")

# One script for every command: the Nth call answers with line N of NAME.answers (the last line once they run out):
# "RC FILE" prints FILE to stdout when RC is 0, else to stderr, and exits RC. --version is not a call: it prints the
# local cluster's recorded version line.
SCRIPT = r"""#!/bin/bash
d=$(dirname "$0"); n=$(basename "$0")
if [ "$*" = --version ]; then cat "$d/version"; exit 0; fi
calls=1; while [ -e "$d/$n.call.$calls" ]; do calls=$((calls + 1)); done
printf '%s\0' "$@" > "$d/$n.call.$calls"
if [ "$n" = sbatch ]; then cp "${@: -1}" "$d/sbatch.script.$calls"; fi
[ -f "$d/$n.answers" ] || exit 0
line=$(sed -n "${calls}p" "$d/$n.answers"); [ -n "$line" ] || line=$(tail -n 1 "$d/$n.answers")
rc=${line%% *}; file=${line#* }
if [ "$rc" = 0 ]; then cat "$file"; else cat "$file" >&2; fi
exit "$rc"
"""


class FakeSlurm:
    """The fake clients in ``folder``; `answer` queues outputs, `calls` reads back what each was run with."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "version").write_text((RECORDED / "sbatch.version").read_text())
        for name in COMMANDS:
            path = folder / name
            path.write_text(SCRIPT)
            path.chmod(0o755)

    def answer(self, command: str, *answers: tuple[int, str | Path]) -> None:
        """Queue (exit code, output) answers for ``command``; output is text or a recorded file (a Path)."""
        lines = []
        for i, (rc, out) in enumerate(answers):
            if not isinstance(out, Path):
                out, text = self.folder / f"{command}.out.{i}", out
                out.write_text(text)
            lines.append(f"{rc} {out}")
        (self.folder / f"{command}.answers").write_text("\n".join(lines) + "\n")

    def calls(self, command: str) -> list[list[str]]:
        """The argv of each call of ``command`` so far."""
        out, call = [], 1
        while (path := self.folder / f"{command}.call.{call}").exists():
            out.append(path.read_text().split("\0")[:-1])
            call += 1
        return out

    def script(self, call: int = 1) -> str:
        """The text of the script handed to sbatch's CALL-th call."""
        return (self.folder / f"sbatch.script.{call}").read_text()

    def environ(self) -> dict[str, str]:
        """PATH with the fakes first; SLURM_CONF at a file that does not exist (no controller to check)."""
        return {
            "PATH": f"{self.folder}{os.pathsep}{os.environ['PATH']}",
            "SLURM_CONF": str(self.folder / "no-slurm.conf"),
        }
