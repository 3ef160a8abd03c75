"""A node's python, project and torch against what the login node rendered the job for (hpc/node/runtime.py)."""

import platform
import sys

import pytest

from hpc.node.cli import NodeCheckError
from hpc.node.runtime import check_runtime, runtime


def test_this_interpreter_matches_itself_and_names_what_differs():
    here = runtime()
    assert here["HPC_EXPECT_PYTHON"] == platform.python_version() and here["HPC_EXPECT_TORCH"]
    assert (
        check_runtime(here) == f"python {platform.python_version()}, hpc-train {here['HPC_EXPECT_PROJECT']}, torch "
        f"{here['HPC_EXPECT_TORCH']}"
    )
    assert check_runtime({}) == "no HPC_EXPECT_* set: nothing to compare"
    with pytest.raises(NodeCheckError) as e:
        check_runtime({**here, "HPC_EXPECT_PYTHON": "3.99.0", "HPC_EXPECT_TORCH": "2.6.0+cu126"})
    msg = str(e.value)
    assert msg.startswith(
        f"this node runs python {platform.python_version()} (rendered for 3.99.0); torch "
        f"{here['HPC_EXPECT_TORCH']} (rendered for 2.6.0+cu126) with {sys.executable}: "
    )
    assert "hpc-train" not in msg and "\n" not in msg  # the project's version agreed
    with pytest.raises(NodeCheckError, match=r"hpc-train not installed \(rendered for 0\.1\.0\)"):
        check_runtime({"HPC_EXPECT_PROJECT": "0.1.0"}, {**here, "HPC_EXPECT_PROJECT": None})
