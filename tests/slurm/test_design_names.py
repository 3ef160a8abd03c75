"""The design's own names, as a user copies them: `python -m hpc.submit --site mycluster --nodes 2` word for word,
from a directory holding the user's profile mycluster.yaml (the local cluster's, training the tiny config), as a dry
run and as a real 2-node job; and `python -m train --help`. The directory also holds a train.py, a train/ package and
a site_configs/ folder of the user's: the ranks still run the project's trainer, and their log names its file."""

import json
import re

import pytest
import yaml
from conftest import ROOT, run_cli, wait_job
from train_helpers import TINY

pytestmark = pytest.mark.slurm

USED_BY = ("-m", "hpc.submit", "--site", "mycluster", "--nodes", "2")  # python -m hpc.submit --site mycluster --nodes 2


def test_the_designs_command_line_word_for_word(slurm, tmp_path):
    profile = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())
    profile["name"], profile["training"]["config"] = "mycluster", str(TINY)
    (tmp_path / "mycluster.yaml").write_text(yaml.safe_dump(profile))
    help_ = run_cli("-m", "train", "--help", cwd=tmp_path)
    assert help_.returncode == 0 and help_.stdout.startswith("usage: python -m train ")
    (tmp_path / "train").mkdir()
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "train.py").write_text("raise SystemExit('the user script ran')\n")
    (tmp_path / "train" / "__init__.py").write_text("raise SystemExit('the user package was imported')\n")
    (tmp_path / "site_configs" / "mycluster.yaml").write_text("not: a profile\n")
    mine = sorted(p.name for p in tmp_path.iterdir())

    dry = run_cli(*USED_BY, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --nodes=2\n" in dry.stdout and " -u -m hpc.node.project_module train --config " in dry.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == mine  # a dry run writes nothing

    r = run_cli(*USED_BY, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted job (\d+)", r.stdout).group(1)
    assert wait_job(job_id, timeout=600) == "COMPLETED"
    records = [json.loads(line) for line in (tmp_path / "jobs" / "train" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 20
    logs = "".join(p.read_text() for p in (tmp_path / "jobs" / "train").glob(f"{job_id}_*_log.out"))
    assert logs.count(f"[train] trainer: {ROOT / 'train' / '__main__.py'}\n") == 2, logs[-2000:]  # one per node
