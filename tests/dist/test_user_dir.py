"""From a directory of the user's that holds a train.py (importing a sibling module), a train/ package and a
site_configs/ folder of theirs, the design's commands run the project's code: the dry run and --emit render the
trainer as the project's module, `-- train.py` submits the user's script, the rank command starts the project's
trainer, and the user's script itself still imports its sibling."""

import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, run_cli


@pytest.fixture
def user_dir(tmp_path) -> Path:
    d = tmp_path / "mywork"
    (d / "train").mkdir(parents=True)
    (d / "site_configs").mkdir()
    (d / "helper.py").write_text("GREETING = 'sibling imported'\n")
    (d / "train.py").write_text("import helper\nprint('USER SCRIPT', helper.GREETING)\n")
    (d / "train" / "__init__.py").write_text("raise SystemExit('USER PACKAGE IMPORTED')\n")
    (d / "site_configs" / "local.yaml").write_text("this: is not a profile\n")
    return d


def rank_line(script: str) -> str:
    return next(line for line in script.splitlines() if "-m hpc.node.launch" in line)


def test_design_commands_from_a_user_dir_run_the_projects_code(user_dir):
    script = run_cli("-m", "hpc.submit", "--site", "local", "--nodes", "1", "--dry-run", "--", "train.py", cwd=user_dir)
    assert script.returncode == 0, script.stderr
    assert rank_line(script.stdout).endswith(f"-u {user_dir / 'train.py'} || rc=$?"), rank_line(script.stdout)

    emitted = user_dir / "job.sbatch"
    r = run_cli("-m", "hpc.submit", "--site", "local", "--nodes", "1", "--emit", str(emitted), cwd=user_dir)
    assert r.returncode == 0, r.stderr
    line = rank_line(emitted.read_text())
    assert " -u -m hpc.node.project_module train --config " in line, line

    for argv in (
        ["-m", "hpc.plan", "--site", "ib-h200", "--nodes", "1", "--model", "0.6B"],
        ["-m", "hpc.jobs", "--help"],
    ):
        r = run_cli(*argv, cwd=user_dir)
        assert r.returncode == 0 and "USER" not in r.stdout + r.stderr, (argv, r.stderr)


def test_the_rank_command_starts_the_projects_trainer_and_the_users_script_keeps_its_sibling(user_dir):
    r = run_cli("-m", "hpc.node.project_module", "train", "--help", cwd=user_dir)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m train"), r.stdout + r.stderr
    r = run_cli("-c", "import hpc, train", cwd=user_dir)  # the user's own interpreter keeps its path: theirs is found
    assert "USER PACKAGE IMPORTED" in r.stderr, r.stderr
    user = subprocess.run([PYTHON, "train.py"], cwd=user_dir, capture_output=True, text=True, timeout=60)
    assert user.stdout == "USER SCRIPT sibling imported\n", user.stderr
    wrong = run_cli("-m", "hpc.node.project_module", "no_such_module", cwd=user_dir)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "no_such_module" in wrong.stderr, wrong.stderr
    assert (ROOT / "train" / "__main__.py").is_file()
