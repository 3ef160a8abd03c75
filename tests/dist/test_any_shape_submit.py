"""The README's first step on the clusters we do not have: a shipped profile copied as mycluster.yaml (its paths
pointed at this machine), then ``python -m hpc.submit --site mycluster --nodes N`` with no config of the user's, at 2
nodes and at the partition's max_nodes, against the fake sbatch of Slurm 24.11 (tests/slurm_fakes.py): sbatch gets the
script alone, and the script is the dry run's, for that many nodes."""

from __future__ import annotations

import pytest
import yaml
from slurm_fakes import FakeSlurm

from hpc import submit as submit_cli
from hpc.site import SHIPPED_SITE_DIR

REMOTE = [p for p in sorted(SHIPPED_SITE_DIR.glob("*.yaml")) if p.stem != "local"]
SUBMITTED = "Submitted batch job 4242\n"


@pytest.mark.parametrize("profile", REMOTE, ids=[p.stem for p in REMOTE])
def test_the_design_line_submits_at_2_and_max_nodes(profile, tmp_path, monkeypatch, capsys):
    fake = FakeSlurm(tmp_path / "bin", version="24.11")  # as the sites run (23.11 to 26.05), not the local 22.05
    for k, v in fake.environ().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("USER", "alice")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    site = yaml.safe_load(profile.read_text())
    site["paths"] = {"job_dir": str(tmp_path / "jobs"), "checkpoint_root": str(tmp_path / "ckpt")}
    (work / "mycluster.yaml").write_text(yaml.safe_dump(site))
    default = next(p for p in site["partitions"] if p.get("default")) if len(site["partitions"]) > 1 else None
    max_nodes = (default or site["partitions"][0])["max_nodes"]
    fake.answer("sbatch", (0, SUBMITTED))
    for call, nodes in enumerate((2, max_nodes), start=1):
        line = ["--site", "mycluster", "--nodes", str(nodes), "--job-name", f"shape{nodes}"]
        with pytest.raises(SystemExit) as e:
            submit_cli.main([*line, "--dry-run"])
        dry = capsys.readouterr().out
        assert e.value.code == 0 and f"#SBATCH --nodes={nodes}\n" in dry
        with pytest.raises(SystemExit) as e:
            submit_cli.main(line)
        out, err = capsys.readouterr()
        assert e.value.code == 0, err
        assert "submitted job 4242 " in out
        argv = fake.calls("sbatch")[call - 1]
        assert len(argv) == 1 and argv[0].endswith(".sh"), argv  # every option is an #SBATCH line of the script
        assert fake.script(call) == dry
