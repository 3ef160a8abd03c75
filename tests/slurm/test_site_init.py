"""`python -m hpc.site init NAME` on the local cluster: it asks Slurm and one node (srun -N1) and writes NAME.yaml,
which `python -m hpc.submit --site NAME` accepts as written (a dry run, and sbatch --test-only against the cluster)."""

import pytest
import yaml
from conftest import run_cli

pytestmark = pytest.mark.slurm


def test_a_profile_written_from_the_cluster_submits(slurm, tmp_path):
    r = run_cli("-m", "hpc.site", "init", "fromslurm", cwd=tmp_path, env=slurm, timeout=400)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = (tmp_path / "fromslurm.yaml").read_text()
    profile = yaml.safe_load(text)
    debug = next(p for p in profile["partitions"] if p["name"] == "debug")
    assert debug["default"] and debug["gpus_per_node"] == 2 and debug["cpus_per_node"] == 2
    assert profile["network"]["nccl_socket_ifname"] == "eth0" and "# from node n" in text  # the probe ran on a node

    dry = run_cli("-m", "hpc.submit", "--site", "fromslurm", "--nodes", "2", "--dry-run", cwd=tmp_path, env=slurm)
    assert dry.returncode == 0 and "#SBATCH --partition=debug\n" in dry.stdout, dry.stderr
    test = run_cli("-m", "hpc.submit", "--site", "fromslurm", "--nodes", "2", "--test-only", cwd=tmp_path, env=slurm)
    assert test.returncode == 0, test.stdout + test.stderr

    again = run_cli("-m", "hpc.site", "init", "fromslurm", cwd=tmp_path, env=slurm)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "exists: pass --force" in again.stderr
    assert (tmp_path / "fromslurm.yaml").read_text() == text
