"""The cluster's Slurm version, read from sbatch --version as each version prints it (recorded from the local cluster on
22.05, 24.11 and 26.05), and what the rendered script's inner sruns carry so that they mean the same on each."""

from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from login_helpers import WORKDIR

from hpc.render import directives, health_argv, srun_args
from hpc.site import load_site
from hpc.slurm_version import check_version, parse_version
from hpc.spec import SpecError, build_spec

DATA = Path(__file__).parent / "data" / "slurm"
FORMS = ROOT / "tests" / "sites" / "local-forms.yaml"
GPU_OPTIONS = ("--gpus-per-node", "--gres", "--gpus", "--gpus-per-task", "--tres-per-task")


@pytest.mark.parametrize(
    "path,version",
    [
        ("sbatch.version", (22, 5)),
        ("versions/24.11/sbatch.version", (24, 11)),
        ("versions/26.05/sbatch.version", (26, 5)),
    ],
)
def test_each_recorded_version_line_is_read(path, version):
    assert parse_version((DATA / path).read_text()) == version


def test_schedmds_own_builds_and_no_version():
    assert parse_version("slurm 23.11.4\n") == (23, 11)
    assert parse_version("sbatch: error: unrecognized option\n") is None


def spec(site: str, partition=None, preflight=False):
    return build_spec(
        load_site(site),
        nodes=2,
        partition=partition,
        workdir=WORKDIR,
        python="/opt/venv/bin/python",
        preflight=preflight,
    )


def test_a_gres_flag_newer_than_the_cluster_is_refused_in_one_line(tmp_path):
    job = spec("slingshot-gh200")  # its ranks' srun takes --gres-flags=allow-task-sharing
    assert "allow-task-sharing" in job.partition.gres_flags
    with pytest.raises(SpecError) as e:
        check_version(job, (22, 5))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"partitions[{job.partition.name}].gres_flags: allow-task-sharing ")
    assert "needs Slurm 23.11 or newer; this cluster runs 22.05" in msg
    check_version(job, (23, 11))
    check_version(job, (26, 5))
    check_version(job, None)  # an sbatch that does not say: nothing refused
    with pytest.raises(SpecError, match="allowed here: allow-task-sharing, enforce-binding"):
        check_version(spec(str(_with_flags(FORMS, "multiple-tasks-per-sharing", tmp_path))), (23, 11))


def _with_flags(path: Path, flag: str, tmp_path: Path) -> Path:
    """The profile at ``path`` with its first partition's gres_flags [flag]."""
    data = yaml.safe_load(path.read_text())
    data["partitions"][0]["gres_flags"] = [flag]
    out = tmp_path / "flags.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize("partition", ["debug", "low", "cpu"])
def test_inner_sruns_name_the_jobs_cpus_and_no_other_gpu_form(partition):
    """26.05 refuses --gres=gpu beside an inherited --gpus-per-node; 22.05-23.02 do not inherit --cpus-per-task."""
    job = spec(str(FORMS), partition, preflight=partition != "cpu")  # a CPU partition has no health step
    d = directives(job)
    job_gpu = {f"--{k}" for k in d if f"--{k}" in GPU_OPTIONS}
    ranks = srun_args(job)
    assert not [a for a in ranks if a.split("=")[0] in GPU_OPTIONS]  # the ranks' step inherits the job's GPUs
    assert f"--cpus-per-task={d['cpus-per-task']}" in ranks
    if not job.preflight:
        return
    health = health_argv(job)
    health = health[: health.index(job.command[0])]  # srun's own options, not hpc.node.health's
    assert {a.split("=")[0] for a in health if a.split("=")[0] in GPU_OPTIONS} == job_gpu
    per_node = int(d["cpus-per-task"]) * int(d["ntasks-per-node"])
    assert f"--cpus-per-task={per_node}" in health and "--ntasks-per-node=1" in health
