"""Which interpreter lines lose the working directory: only ``python ... -m hpc...``, read as CPython reads its
options; and only entries naming the working directory, never the project's own root."""

import os

import pytest

from hpc.node.clean_path import module_run, without_working_dir


@pytest.mark.parametrize(
    "argv, module",
    [
        (["python", "-m", "hpc.submit", "--site", "x"], "hpc.submit"),
        (["python", "-u", "-m", "hpc.node.launch", "--", "train.py"], "hpc.node.launch"),
        (["python", "-um", "hpc.node.project_module", "train"], "hpc.node.project_module"),
        (["python", "-mhpc.jobs"], "hpc.jobs"),
        (["python", "-X", "importtime", "-W", "ignore", "-m", "hpc.plan"], "hpc.plan"),
        (["python", "-Xdev", "-m", "hpc.plan"], "hpc.plan"),
        (["python", "train.py", "-m", "hpc.submit"], None),  # a script: its own arguments
        (["python", "-c", "import hpc", "-m", "hpc.x"], None),
        (["python", "-Wmodule", "train.py"], None),  # -W's value holds an m, not the -m flag
        (["python"], None),
    ],
)
def test_module_run_reads_the_interpreters_options(argv, module):
    assert module_run(argv) == module


def test_only_the_working_directory_leaves_and_never_the_projects_root(tmp_path):
    own, work, other = tmp_path / "project", tmp_path / "work", tmp_path / "lib"
    for d in (own, work, other):
        d.mkdir()
    os.symlink(work, tmp_path / "link")
    path = [str(work), "", str(other), str(tmp_path / "link"), str(own), "lib"]
    assert without_working_dir(path, str(work), own) == [str(other), str(own), "lib"]
    assert without_working_dir(path, str(own), own) == path
