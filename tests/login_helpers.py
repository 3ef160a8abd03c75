"""The login side's shared test pieces: profiles, rendered scripts and the golden cases' command lines."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import ROOT

from hpc.render import render_sbatch
from hpc.site import SHIPPED_SITE_DIR, load_site
from hpc.spec import PROJECT_ROOT, build_spec

SITES = sorted(p.stem for p in SHIPPED_SITE_DIR.glob("*.yaml"))
TEST_SITES = sorted(str(p) for p in (ROOT / "tests" / "sites").glob("*.yaml"))  # profiles for tests only
HOSTILE = "x; touch /tmp/owned $(id) `id` 'q\" $HOME"  # a backslash is refused: #SBATCH lines drop it
WORKDIR = Path("/home/alice/project")
_TINY = "{PROJECT}/train/configs/tiny.yaml"

# One line per golden case: NAME -> the hpc.submit command line ({WORK}: the directory it runs in, {PROJECT}: the
# checkout).
CASES = {
    **{
        site: ["--site", site, "--nodes", "2"] for site in SITES
    },  # srun, per profile (roce-h100: pyxis); the planner's layout on GPU sites
    "local-torchrun": ["--site", "local", "--nodes", "2", "--launcher", "torchrun"],
    "local-accelerate": ["--site", "local", "--nodes", "2", "--launcher", "accelerate"],
    "ib-h200-planned": [
        "--site",
        "ib-h200",
        "--nodes",
        "2",
        "--",
        "--config",
        _TINY,
        "global_batch=32",
    ],  # planner-added args
    "ib-h200-layout-given": [
        "--site",
        "ib-h200",
        "--nodes",
        "2",
        "--",
        "--config",
        _TINY,
        "global_batch=32",
        "parallel.tp=2",
    ],
    "apptainer-h100": ["--site", "{PROJECT}/tests/sites/apptainer-h100.yaml", "--nodes", "2"],  # an Apptainer image
    "local-sweep": [
        "--site",
        "local",
        "--nodes",
        "1",
        "--job-name",
        "lr-sweep",
        "--sweep",
        "optim.lr=1e-4,3e-4",  # an array,
        "--sweep",
        "micro_batch=2,4",
        "--max-parallel",
        "2",
        "--after",
        "123:any",
    ],  # chained after job 123
    "local-nodes-preflight": [
        "--site",
        "local",
        "--nodes",
        "2",
        "--nodelist",
        "n[1-2]",
        "--exclude",
        "n4",  # where it runs,
        "--preflight",
    ],  # health checked first
    "ib-h200-preflight": [
        "--site",
        "ib-h200",
        "--nodes",
        "2",
        "--exclude",
        "gpu[07-08],gpu11",
        "--preflight",
    ],  # rates judged
    "local-gres": ["--site", "{PROJECT}/tests/sites/local-forms.yaml", "--nodes", "2"],  # --gres=gpu:N, --gres-flags
    "local-gpus-bind": [
        "--site",
        "{PROJECT}/tests/sites/local-forms.yaml",
        "--partition",
        "low",
        "--nodes",
        "2",  # --gpus,
        "--preflight",
    ],  # --gpu-bind, --cpu-bind
    "local-cpu": [
        "--site",
        "{PROJECT}/tests/sites/local-forms.yaml",
        "--partition",
        "cpu",
        "--nodes",
        "2",
    ],  # no GPUs: no health step (--preflight is refused, tests/bad_input_cases.py)
    "local-spares": [
        "--site",
        "local",
        "--nodes",
        "2",
        "--spare-nodes",
        "1",
        "--preflight",
    ],  # in-job restarts on a spare
    **{  # each GPU form with a spare: the job's request and the health step's over all 3 nodes, the ranks' over 2; a
        # CPU partition's restart expects no GPUs of a node it checks
        f"local-{form}-spares": [
            "--site",
            "{PROJECT}/tests/sites/local-forms.yaml",
            "--partition",
            partition,
            "--nodes",
            "2",
            "--spare-nodes",
            "1",
            *(["--preflight"] if partition != "cpu" else []),
        ]
        for form, partition in (("gres", "debug"), ("gpus", "low"), ("cpu", "cpu"))
    },
    "submitit": [
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        "smoke",
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        "{WORK}/ranks",
    ],
}


def command_line(name: str, workdir: Path) -> list[str]:
    """The golden case NAME's hpc.submit arguments, run from ``workdir``."""
    return [a.replace("{WORK}", str(workdir.resolve())).replace("{PROJECT}", str(ROOT)) for a in CASES[name]]


def render(site_name: str, monkeypatch, **kw) -> str:
    """The script of a job on ``site_name`` (2 nodes unless ``nodes``), submitted by alice from /home/alice/project."""
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", "/home/alice")
    site = load_site(site_name)
    spec = build_spec(
        site, nodes=kw.pop("nodes", 2), workdir=WORKDIR, python=site.environment.python or "/opt/venv/bin/python", **kw
    )
    return render_sbatch(spec).replace(str(PROJECT_ROOT), "{PROJECT}")


def profile(tmp_path: Path, container=None, partition_container=None, name="ctr") -> Path:
    """The shipped local profile renamed NAME, with a container (and one for its second partition) when given."""
    data = yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text())
    data["name"] = name
    if container is not None:
        data["container"] = container
    if partition_container is not None:
        data["partitions"][1]["container"] = partition_container
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def spec_for(path: Path, **kw):
    """A one-node smoke job on the profile at ``path``."""
    return build_spec(
        load_site(str(path)),
        nodes=1,
        workdir=WORKDIR,
        python="/opt/venv/bin/python",
        args=["-m", "hpc.node.smoke"],
        **kw,
    )


def sweep_spec(monkeypatch, *sweep: str, **kw):
    """A one-node job `lr` on the local profile sweeping ``sweep``."""
    monkeypatch.setenv("USER", "alice")
    return build_spec(
        load_site("local"),
        nodes=1,
        workdir=WORKDIR,
        python="python",
        job_name="lr",
        sweep=sweep,
        args=["--config", "tiny.yaml"],
        **kw,
    )
