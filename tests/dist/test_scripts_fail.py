"""scripts/install.sh and scripts/demo_chat.sh stop non-zero, naming what failed, when a step fails; they get through
when every step succeeds. Each script runs from a copy of the checkout's files with a stand-in interpreter that
records its arguments and fails on request (pip and the cluster are not what is tested here: the scripts' exit
status is)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STANDIN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
for a in "$@"; do
  if [ -n "${FAIL_ON:-}" ] && [ "$a" = "$FAIL_ON" ]; then
    echo "ERROR: No matching distribution found for $FAIL_ON" >&2
    exit 1
  fi
done
case "$*" in
  *hpc.submit*) echo "submitted job 7"; echo "[wait] job 7 finished: COMPLETED" ;;
  *train.generate*) echo "Macbeth." ;;
esac
"""


def copy(tmp: Path, *files: str) -> Path:
    root = tmp / "checkout"
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    return root


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def run(script: Path, tmp: Path, fail_on: str | None, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp / "calls.txt"
    calls.write_text("")
    full = {**os.environ, "CALLS": str(calls), **env}
    full.pop("FAIL_ON", None)
    full.pop("SLURM_VERSION", None)  # CI's: the scripts here run on the host's Slurm, whose default needs no chroot
    if fail_on:
        full["FAIL_ON"] = fail_on
    proc = subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60)
    return proc, calls.read_text().splitlines()


def floors() -> dict[str, str]:
    """The >=/== floors of pyproject.toml's torch, transformers, accelerate and submitit, read with packaging."""
    import tomllib
    from packaging.requirements import Requirement

    out = {}
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(dep)
        if req.name in ("torch", "transformers", "accelerate", "submitit"):
            (low,) = [s.version for s in req.specifier if s.operator in (">=", "==")]
            out[req.name] = low
    return out


@pytest.fixture
def install(tmp_path):
    root = copy(tmp_path, "scripts/install.sh", "pyproject.toml")
    bin_dir = tmp_path / "bin"
    for cmd in ("slurmctld", "slurmd", "sbatch", "munged", "slurmdbd", "mariadbd", "ip", "nsenter", "bwrap"):
        executable(bin_dir / cmd, "#!/bin/sh\n")  # present: no apt step
    executable(tmp_path / "venv" / "bin" / "python", STANDIN)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VENV": str(tmp_path / "venv")}
    return root / "scripts" / "install.sh", env


def test_install_installs_the_floors(install, tmp_path):
    script, env = install
    proc, calls = run(script, tmp_path, None, **env)
    assert proc.returncode == 0, proc.stderr
    want = floors()
    assert want == {"torch": "2.13.0", "transformers": "5.24.0", "accelerate": "1.16.0", "submitit": "1.5.4"}
    assert calls[0].endswith(f"install -q --disable-pip-version-check torch=={want['torch']}")
    constraint = calls[1].split("--constraint ")[1].split()[0]
    assert "-e" in calls[1].split() and "[test]" in calls[1]
    assert f"torch=={want['torch']}" in proc.stdout and f"submitit=={want['submitit']}" in proc.stdout
    assert not Path(constraint).exists()  # removed on exit


@pytest.mark.parametrize("fail_on,named", [("torch==2.13.0", "torch==2.13.0"), ("torchao==0.17.0", "torchao==0.17.0")])
def test_install_stops_naming_the_failed_package(install, tmp_path, fail_on, named):
    script, env = install
    proc, calls = run(script, tmp_path, fail_on, **env)
    assert proc.returncode == 1
    assert f"ERROR: No matching distribution found for {fail_on}" in proc.stdout  # pip's own line is shown
    assert f"[install] FAILED: pip install {named}" in proc.stderr
    assert not any("import torch" in c for c in calls)  # stopped before the final check


@pytest.fixture
def demo(tmp_path):
    root = copy(tmp_path, "scripts/demo_chat.sh")
    lab = tmp_path / "lab"
    executable(lab / "bin" / "sinfo", "#!/bin/sh\n")
    (lab / "env.sh").write_text(f'export PATH="{lab / "bin"}:$PATH"\n')
    python = executable(tmp_path / "python", STANDIN)
    return root / "scripts" / "demo_chat.sh", {"LAB": str(lab), "PYTHON": str(python), "JOB": "t"}


def test_demo_chat_succeeds_when_every_step_does(demo, tmp_path):
    script, env = demo
    proc, calls = run(script, tmp_path, None, **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("assistant: Macbeth.") == 2 and len(calls) == 5  # prepare, train, report, 2 answers


@pytest.mark.parametrize(
    "fail_on,message,calls_made",
    [
        ("train.prepare", "demo_chat.sh: the prepare job failed (exit 1)", 1),
        ("train.generate", "demo_chat.sh: the exported model did not answer (train.generate exit 1)", 4),
    ],
)
def test_demo_chat_fails_when_a_step_fails(demo, tmp_path, fail_on, message, calls_made):
    script, env = demo
    proc, calls = run(script, tmp_path, fail_on, **env)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert len(calls) == calls_made
