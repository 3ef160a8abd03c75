"""Golden sbatch scripts per feature: what hpc.submit renders for a command line is tests/golden/NAME.sbatch.

The slurm tier submits the "submitit" case through submitit and compares the script Slurm received with the same
file: the dry run is the submission. UPDATE_GOLDEN=1 refreshes every file.
"""

import pytest
from conftest import GOLDEN_WORKDIR, assert_golden
from login_helpers import CASES, command_line

from hpc.render import render_sbatch
from hpc.submit import parser, plan_spec, split_args


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name, tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", GOLDEN_WORKDIR.rsplit("/", 1)[0])
    monkeypatch.chdir(tmp_path)
    own, rank_args = split_args(command_line(name, tmp_path))
    assert_golden(name, render_sbatch(plan_spec(parser().parse_args(own), rank_args)), tmp_path)
