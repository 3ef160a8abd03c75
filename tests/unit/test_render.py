"""Rendered sbatch scripts: every value quoted, one task per node for torchrun and accelerate, the network preamble."""

import shlex
from pathlib import Path

import pytest
from login_helpers import render

from hpc.render import preamble_lines
from hpc.site import load_site
from hpc.spec import build_spec


def test_trainer_args_are_quoted_and_default_config_added(monkeypatch):
    text = render("local", monkeypatch, args=["optim.lr=1e-3", "run.name=a b;c"])
    launch = next(line for line in text.splitlines() if line.endswith(" || rc=$?")).removesuffix(" || rc=$?")
    assert shlex.split(launch)[-8:] == [
        "-m",
        "train",
        "--config",
        "{PROJECT}/train/configs/demo.yaml",
        "optim.lr=1e-3",
        "run.name=a b;c",
        "log.dir=/home/alice/project/jobs/train",
        "checkpoint.dir=/home/alice/project/checkpoints/train",
    ]
    assert "'run.name=a b;c'" in launch


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_per_node_launch_is_one_task_per_node(monkeypatch, launcher):
    text = render("ib-h200", monkeypatch, launcher=launcher)
    assert "#SBATCH --ntasks-per-node=1\n" in text
    assert f"--launcher {launcher} --gpus-per-node 8 --" in text
    assert f"starts {launcher} with it" in text and f", {launcher} launch, site ib-h200." in text
    assert "$SLURM_NODEID" not in text  # the node rank is read on each node by hpc.node.launch, never expanded here


def test_preamble_is_the_network_table(monkeypatch):
    monkeypatch.setenv("USER", "alice")
    site = load_site("roce-h100")
    lines = preamble_lines(build_spec(site, nodes=1, workdir=Path("/w"), python="python"))
    assert "export NCCL_IB_GID_INDEX=3" in lines
    assert "export NCCL_IB_HCA='^mlx5_bond_0'" in lines
    assert "export NCCL_SOCKET_IFNAME=bond0" in lines


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Nothing is submitted either: the unit tier refuses every process, sbatch included."""
    from hpc.submit import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--site", "local", "--nodes", "2", "--dry-run"])
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    assert out.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in out
    assert list(tmp_path.iterdir()) == []
