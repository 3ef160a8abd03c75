"""Golden sbatch scripts per feature: what hpc.login.submit renders for a command line is tests/golden/NAME.sbatch.

The slurm tier submits the "submitit" case through submitit and compares the script Slurm received with the same
file: the dry run is the submission. UPDATE_GOLDEN=1 refreshes every file.
"""
import pytest

from conftest import GOLDEN_WORKDIR, ROOT, assert_golden
from hpc.login.render import render_sbatch
from hpc.login.site import SHIPPED_SITE_DIR
from hpc.login.submit import parser, plan_spec, split_args

SITES = sorted(p.stem for p in SHIPPED_SITE_DIR.glob("*.yaml"))

TINY = "{PROJECT}/hpc/train/configs/tiny.yaml"

# One line per case: NAME -> the hpc.login.submit command line ({WORK}: the directory it runs in, {PROJECT}: the checkout).
CASES = {
    **{site: ["--site", site, "--nodes", "2"] for site in SITES},  # srun, per profile (roce-h100: pyxis); the planner's layout on GPU sites
    "local-torchrun": ["--site", "local", "--nodes", "2", "--launcher", "torchrun"],
    "local-accelerate": ["--site", "local", "--nodes", "2", "--launcher", "accelerate"],
    "ib-h200-planned": ["--site", "ib-h200", "--nodes", "2", "--", "--config", TINY, "global_batch=32"],  # planner-added args
    "ib-h200-layout-given": ["--site", "ib-h200", "--nodes", "2", "--", "--config", TINY, "global_batch=32", "parallel.tp=2"],
    "apptainer-h100": ["--site", "{PROJECT}/tests/sites/apptainer-h100.yaml", "--nodes", "2"],  # an Apptainer image
    "local-sweep": ["--site", "local", "--nodes", "1", "--job-name", "lr-sweep", "--sweep", "optim.lr=1e-4,3e-4",  # an array,
                    "--sweep", "micro_batch=2,4", "--max-parallel", "2", "--after", "123:any"],         # chained after job 123
    "local-nodes-preflight": ["--site", "local", "--nodes", "2", "--nodelist", "n[1-2]", "--exclude", "n4",  # where it runs,
                              "--preflight"],                                                        # health checked first
    "ib-h200-preflight": ["--site", "ib-h200", "--nodes", "2", "--exclude", "gpu[07-08],gpu11", "--preflight"],  # rates judged
    "submitit": ["--site", "local", "--nodes", "2", "--job-name", "smoke", "--", "-m", "hpc.node.smoke", "--out", "{WORK}/ranks"],
}


def command_line(name: str, workdir) -> list[str]:
    return [a.replace("{WORK}", str(workdir.resolve())).replace("{PROJECT}", str(ROOT)) for a in CASES[name]]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name, tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", GOLDEN_WORKDIR.rsplit("/", 1)[0])
    monkeypatch.chdir(tmp_path)
    own, rank_args = split_args(command_line(name, tmp_path))
    assert_golden(name, render_sbatch(plan_spec(parser().parse_args(own), rank_args)), tmp_path)
