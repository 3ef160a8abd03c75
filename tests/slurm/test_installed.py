"""The built wheel, installed into a venv outside the checkout, runs a real job on the local cluster from another
directory: the nodes run the installed packages, with nothing of the checkout on their path."""

import json
import re
import subprocess

import pytest
from wheel_helpers import build_wheel, install_wheel, installed_env

pytestmark = pytest.mark.slurm


def test_installed_package_trains_on_the_cluster(slurm, tmp_path):
    bin_dir = install_wheel(build_wheel(tmp_path / "build"), tmp_path / "venv")
    train_dir = subprocess.run(
        [str(bin_dir / "python"), "-c", "import train, pathlib; print(pathlib.Path(train.__file__).parent)"],
        cwd=tmp_path,
        env=installed_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    work = tmp_path / "work"
    work.mkdir()
    tiny = f"{train_dir}/configs/tiny.yaml"
    r = subprocess.run(
        [
            str(bin_dir / "hpc-submit"),
            "--site",
            "local",
            "--nodes",
            "1",
            "--job-name",
            "installed",
            "--wait",
            "--",
            "--config",
            tiny,
            "steps=6",
            "log.log_every=3",
        ],
        cwd=work,
        env=installed_env(**slurm),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    run = work / "jobs" / "installed"
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7))
    script = next(run.glob(f"{job}_submission.sh")).read_text()
    assert f"{bin_dir / 'python'} -u -m hpc.node.launch" in script and f"--config {tiny}" in script
