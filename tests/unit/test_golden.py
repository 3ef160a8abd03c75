"""Golden sbatch scripts per feature: what hpc.submit renders for a command line is tests/golden/NAME.sbatch.

The slurm tier submits the "submitit" case through submitit and compares the script Slurm received with the same
file: the dry run is the submission. UPDATE_GOLDEN=1 refreshes every file.
"""

import re

import pytest
from conftest import GOLDEN_WORKDIR, ROOT, assert_golden
from login_helpers import CASES, command_line

from hpc.node import contract
from hpc.render import render_sbatch
from hpc.submit import parser, planned_spec, split_args


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name, tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", GOLDEN_WORKDIR.rsplit("/", 1)[0])
    monkeypatch.chdir(tmp_path)
    own, rank_args = split_args(command_line(name, tmp_path))
    assert_golden(name, render_sbatch(planned_spec(parser().parse_args(own), rank_args)[0]), tmp_path)


def test_the_scripts_modules_come_from_the_contract():
    """Every ``python -m NAME`` of a rendered script (but a user's own ``-- -m MODULE``) is a name of
    hpc/node/contract.py; a module named anywhere else would drift from what the nodes run."""
    ours = {value for name, value in vars(contract).items() if name.endswith("_MODULE")}
    users = {"hpc.node.smoke"}  # the submitit case's own command: -- -m hpc.node.smoke
    text = "".join(p.read_text() for p in (ROOT / "tests" / "golden").glob("*.sbatch"))
    named = set(re.findall(r"-m ([\w.]+)", text))
    named |= set(re.findall(rf"-m {re.escape(contract.PROJECT_MODULE)} ([\w.]+)", text))  # the module it runs
    assert named - users <= ours and {"hpc.submit", "hpc.node.launch", contract.PROJECT_MODULE, "train"} <= named
    assert ours == {
        "hpc.submit",
        "hpc.node.launch",
        "hpc.node.health",
        "hpc.node.restart",
        "hpc.node.batch_host",  # started by hpc.node.restart, not the script
        "hpc.node.standby",  # the same
        "hpc.node.project_module",
        "train",
    }
