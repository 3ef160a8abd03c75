"""Rendered sbatch scripts: golden files per shipped profile, valid bash, every value quoted."""
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from hpc.ownership import run_dir_name
from hpc.render import preamble_lines, render_sbatch
from hpc.site import PROJECT_SITE_DIR, load_site
from hpc.spec import PROJECT_ROOT, build_spec

GOLDEN = Path(__file__).parent / "golden"
SITES = sorted(p.stem for p in PROJECT_SITE_DIR.glob("*.yaml"))
HOSTILE = "x; touch /tmp/owned $(id) `id` 'q\" $HOME"  # a backslash is refused: #SBATCH lines drop it


def render(site_name: str, monkeypatch, **kw) -> str:
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", "/home/alice")
    site = load_site(site_name)
    spec = build_spec(site, nodes=kw.pop("nodes", 2), workdir=Path("/home/alice/project"),
                      python=site.environment.python or "/opt/venv/bin/python", **kw)
    return render_sbatch(spec).replace(str(PROJECT_ROOT), "{PROJECT}")


@pytest.mark.parametrize("site,launcher", [(site, "srun") for site in SITES] + [("local", "torchrun"), ("local", "accelerate")])
def test_golden(site, launcher, monkeypatch):
    """One golden script per profile, and per launcher; hpc.submit submits exactly this text."""
    text = render(site, monkeypatch, launcher=launcher)
    path = GOLDEN / (f"{site}.sbatch" if launcher == "srun" else f"{site}-{launcher}.sbatch")
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{path} differs; review and refresh with UPDATE_GOLDEN=1"


def test_golden_array_job(monkeypatch):
    """A sweep: one array job (at most 2 tasks at a time) chained after another job; the case table picks each task's overrides."""
    text = render("local", monkeypatch, nodes=1, job_name="lr-sweep", sweep=["optim.lr=1e-4,3e-4", "micro_batch=2,4"],
                  max_parallel=2, after=["123:any"])
    path = GOLDEN / "local-sweep.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{path} differs; review and refresh with UPDATE_GOLDEN=1"


@pytest.mark.parametrize("site", SITES)
def test_bash_parses_every_rendering(site, monkeypatch, tmp_path):
    for kw in ({}, {"launcher": "torchrun"}, {"launcher": "accelerate"}, {"job_name": HOSTILE}, {"args": ["-m", "hpc.smoke", "--out", "/a b/$(x)"]}):
        f = tmp_path / "job.sbatch"
        f.write_text(render(site, monkeypatch, **dict(kw)))
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_hostile_job_name_stays_one_quoted_word(monkeypatch):
    text = render("local", monkeypatch, job_name=HOSTILE)
    line = next(l for l in text.splitlines() if l.startswith("#SBATCH --job-name="))
    assert shlex.split(line.removeprefix("#SBATCH --job-name=")) == [HOSTILE]
    # outside the quoted directive it appears only in a comment, one quoted export and as a directory name
    export = next(l for l in text.splitlines() if l.startswith("export HPC_JOB_NAME="))
    r = subprocess.run(["bash", "-c", f'{export}; printf %s "$HPC_JOB_NAME"'], capture_output=True, text=True)
    assert r.stdout == HOSTILE
    executable = [l for l in text.splitlines() if l and not l.startswith("#") and l != export]
    assert not any("touch /tmp" in l or "$(id)" in l for l in executable)
    assert f"/jobs/{run_dir_name(HOSTILE)}/%j_0_log.out" in text
    assert run_dir_name(HOSTILE).startswith("x_touch_tmp_owned_id_id_q_HOME-")


def test_trainer_args_are_quoted_and_default_config_added(monkeypatch):
    text = render("local", monkeypatch, args=["optim.lr=1e-3", "run.name=a b;c"])
    launch = next(l for l in text.splitlines() if l.endswith(" || rc=$?")).removesuffix(" || rc=$?")
    assert shlex.split(launch)[-8:] == ["-m", "train", "--config", "{PROJECT}/train/configs/demo.yaml", "optim.lr=1e-3", "run.name=a b;c",
                                        "log.dir=/home/alice/project/jobs/train", "checkpoint.dir=/home/alice/project/checkpoints/train"]
    assert "'run.name=a b;c'" in launch


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_per_node_launch_is_one_task_per_node(monkeypatch, launcher):
    text = render("ib-h200", monkeypatch, launcher=launcher)
    assert "#SBATCH --ntasks-per-node=1\n" in text
    assert f"--launcher {launcher} --gpus-per-node 8 --" in text
    assert f"starts {launcher} with it" in text and f", {launcher} launch, site ib-h200." in text
    assert "$SLURM_NODEID" not in text  # the node rank is read on each node by hpc.launch, never expanded here


def test_preamble_is_the_network_table(monkeypatch):
    monkeypatch.setenv("USER", "alice")
    site = load_site("roce-h100")
    lines = preamble_lines(build_spec(site, nodes=1, workdir=Path("/w"), python="python"))
    assert "export NCCL_IB_GID_INDEX=3" in lines
    assert "export NCCL_IB_HCA='^mlx5_bond_0'" in lines
    assert "export NCCL_SOCKET_IFNAME=bond0" in lines
