"""Fake Slurm clients for tests without a cluster: `sbatch`, `squeue`, `scontrol`, `sacct` (and `srun`, which submitit
looks for). Each records its argv (and sbatch the script it was handed) and answers with the next of the outputs
queued for it: real outputs recorded from the local cluster (tests/unit/data/slurm, scripts/record_slurm_outputs.py)
or sbatch's own lines. ``FakeSlurm`` puts them as small scripts first on PATH (the dist tier: real processes);
``InProcessSlurm`` answers for them in process (the unit tier, which starts none)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import submitit
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
    """The fake clients in ``folder``; `answer` queues outputs, `calls` reads back what each was run with. ``version``:
    the Slurm whose recorded ``--version`` line they print (None: the local cluster's)."""

    def __init__(self, folder: Path, version: str | None = None):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        recorded = RECORDED / "versions" / version if version else RECORDED
        (folder / "version").write_text((recorded / "sbatch.version").read_text())
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


class InProcessSlurm:
    """The same clients without processes, as submitit's ``MockedSubprocess`` (core/test_core.py) does it:
    ``subprocess.Popen`` (the tool runner's squeue, scontrol, sacct, sbatch --test-only), ``subprocess.run``,
    submitit's ``CommandFunction`` (its sbatch) and ``shutil.which`` answer for them; any other program goes to the
    real ``subprocess.Popen`` or ``run``, which the unit tier refuses. ``answer`` and ``calls`` as ``FakeSlurm``'s:
    the Nth call gets the Nth answer (the last once they run out), a command without answers exits 0 and prints
    nothing; ``--version`` is not a call."""

    def __init__(self, monkeypatch, folder: Path):
        self.folder = folder  # SLURM_CONF points at a file there that does not exist: no controller to check
        self._answers: dict[str, list[tuple[int, str]]] = {}
        self._calls: dict[str, list[list[str]]] = {name: [] for name in COMMANDS}
        self._scripts: list[str] = []
        self._run, self._popen, self._which = subprocess.run, subprocess.Popen, shutil.which
        monkeypatch.setattr(subprocess, "run", self.run)
        monkeypatch.setattr(subprocess, "Popen", self.popen)
        monkeypatch.setattr(shutil, "which", self.which)
        monkeypatch.setattr(submitit.core.utils, "CommandFunction", self.command_function)
        monkeypatch.setenv("SLURM_CONF", str(folder / "no-slurm.conf"))

    def answer(self, command: str, *answers: tuple[int, str | Path]) -> None:
        """Queue (exit code, output) answers for ``command``; output is text or a recorded file (a Path)."""
        self._answers[command] = [(rc, out.read_text() if isinstance(out, Path) else out) for rc, out in answers]

    def calls(self, command: str) -> list[list[str]]:
        """The argv (without the program) of each call of ``command`` so far."""
        return [list(argv) for argv in self._calls[command]]

    def script(self, call: int = 1) -> str:
        """The text of the script handed to sbatch's CALL-th call."""
        return self._scripts[call - 1]

    def _answer(self, argv: list[str]) -> tuple[int, str]:
        name = Path(argv[0]).name
        if argv[1:] == ["--version"]:  # not a call, as for FakeSlurm: the local cluster's recorded version line
            return 0, (RECORDED / f"{name}.version").read_text() if (RECORDED / f"{name}.version").exists() else ""
        self._calls[name].append([str(a) for a in argv[1:]])
        if name == "sbatch":
            self._scripts.append(Path(argv[-1]).read_text())
        queued = self._answers.get(name) or [(0, "")]
        return queued[min(len(self._calls[name]), len(queued)) - 1]

    def run(self, argv, *args, capture_output: bool = False, text: bool = False, check: bool = False, **kwargs):
        if Path(argv[0]).name not in COMMANDS:
            return self._run(argv, *args, capture_output=capture_output, text=text, check=check, **kwargs)
        rc, out = self._answer(list(argv))
        stdout, stderr = (out, "") if rc == 0 else ("", out)
        if not text:
            stdout, stderr = stdout.encode(), stderr.encode()
        result = subprocess.CompletedProcess(
            argv, rc, stdout if capture_output else None, stderr if capture_output else None
        )
        if check:
            result.check_returncode()
        return result

    def popen(self, argv, *args, **kwargs):
        if Path(argv[0]).name not in COMMANDS:
            return self._popen(argv, *args, **kwargs)
        rc, out = self._answer(list(argv))
        return Answered(rc, *((out, "") if rc == 0 else ("", out)))

    def which(self, name, *args, **kwargs):
        return str(self.folder / name) if name in COMMANDS else self._which(name, *args, **kwargs)

    def command_function(self, command: list[str], verbose: bool = True, cwd=None, env=None):
        """submitit's CommandFunction: stdout (stripped), or FailedJobError with stderr, which it also prints."""

        def call(*args) -> str:
            rc, out = self._answer([*command, *map(str, args)])
            if rc == 0:
                return out.strip()
            if not verbose:
                print(out.strip(), file=sys.stderr)
            raise submitit.core.utils.FailedJobError(out.strip())

        return call


class Answered:
    """What ``subprocess.Popen`` hands the tool runner, for a command that has already answered."""

    def __init__(self, rc: int, out: str, err: str):
        self.returncode, self.pid = rc, -1
        self.stdout, self.stderr = io.BytesIO(out.encode()), io.BytesIO(err.encode())

    def wait(self, timeout=None) -> int:
        return self.returncode

    def poll(self) -> int:
        return self.returncode
