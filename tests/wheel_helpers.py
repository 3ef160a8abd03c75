"""The project as a user installs it: a wheel built from the checkout, installed into a fresh virtual environment
outside it. The environment reuses the test environment's site-packages (torch, transformers, ...) through a .pth
line, so only the project itself comes from the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what the wheel is built from: the packages and the metadata (a copy, so the build leaves nothing in the checkout)
SOURCES = ("hpc", "train", "sbatch_templates", "site_configs", "pyproject.toml", "README.md")


def build_wheel(dest: Path) -> Path:
    """Build the project's wheel into ``dest`` from a copy of its sources; returns the .whl path."""
    src = dest / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(dest / "dist"),
        ],
        cwd=src,
        check=True,
        capture_output=True,
        text=True,
    )
    shutil.rmtree(src)
    (wheel,) = (dest / "dist").glob("hpc_train-*.whl")
    return wheel


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A fresh venv at ``venv`` with ``wheel`` installed (no dependencies: those come from this environment's
    site-packages); returns its bin directory."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bin_dir = venv / "bin"
    purelib = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "hpc_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the editable install of the checkout, visible through the .pth line, is not this wheel
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(bin_dir / "python"),
            "install",
            "--no-deps",
            "--ignore-installed",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=installed_env(),
    )
    return bin_dir


def installed_env(**extra: str) -> dict[str, str]:
    """The environment for the installed commands: no PYTHONPATH, so nothing of the checkout is importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(extra)
    return env
