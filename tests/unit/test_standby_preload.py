"""What hpc.node.restart has each node's standby import, read from the ranks' command as the rendered scripts give
it (tests/golden/*-spares.sbatch): the trainer for the project's ranks, torch and transformers for a script of the
user's, nothing where hpc.node.launch does not start the ranks itself."""

import shlex

import pytest
from conftest import ROOT

from hpc.node.restart import standby_preload


def ranks_command(golden: str) -> list[str]:
    """The command after ``hpc.node.restart ... --`` in a golden script (its continuation lines joined)."""
    text = (ROOT / "tests" / "golden" / golden).read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if "-m hpc.node.restart " in x)
    words = shlex.split(line.split(" -- ", 1)[1].split(" || ")[0])
    return words


@pytest.mark.parametrize("golden", ["local-cpu-spares.sbatch", "local-gres-spares.sbatch", "local-spares.sbatch"])
def test_the_trainers_ranks_get_the_trainer_imported(golden):
    assert standby_preload(ranks_command(golden)) == ["torch", "transformers", "train.loop"]


def test_a_users_script_gets_torch_and_transformers_and_other_launchers_nothing():
    launch = ["srun", "--ntasks-per-node=2", "/v/python", "-u", "-m", "hpc.node.launch"]
    assert standby_preload([*launch, "--", "/v/python", "-u", "my_train.py", "--lr", "1e-4"]) == [
        "torch",
        "transformers",
    ]
    assert standby_preload([*launch, "--launcher", "srun", "--", "/v/python", "-m", "train"]) == [
        "torch",
        "transformers",
    ]
    assert standby_preload([*launch, "--launcher", "torchrun", "--", "/v/python", "my_train.py"]) == []
    assert standby_preload([*launch, "--launcher=accelerate", "--", "/v/python", "my_train.py"]) == []
    assert standby_preload([*launch, "--container", "apptainer exec x.sif", "--", "/v/python", "my_train.py"]) == []
    assert standby_preload(["srun", "/v/python", "my_train.py"]) == []
