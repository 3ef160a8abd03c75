"""The trainer through the real cluster: 2 nodes x 2 ranks, dp2 x tp2 over the nodes' eth0."""

import json
import re

import pytest
from conftest import run_cli
from train_helpers import TINY

from train.generate import generate

pytestmark = pytest.mark.slurm


def test_submit_trains_dp_x_tp_across_two_nodes_and_exports(slurm, tmp_path):
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        "tiny",
        "--wait",
        "--",
        "--config",
        str(TINY),
        "parallel.tp=2",
        "steps=40",
        "log.log_every=10",
        "export=hf",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "[train] layout dp=2 x tp=2 on 4 ranks" in r.stdout
    net = re.escape(slurm["NET"])
    assert re.search(rf"gloo eth0 \({net}\.1\d\)", r.stdout)  # rank traffic on the namespaces' interface
    run = tmp_path / "jobs" / "tiny"
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses  # the loss falls
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    split = [r for r in records if "wait_s" in r]  # compute or network: one timed step per log line
    assert [r["step"] for r in split] == [10, 20, 30, 40]
    assert all(r["compute_s"] > 0 and r["wait_s"] >= 0 for r in split)
    assert "% waiting)" in r.stdout
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    ranks = {m for f in run.glob(f"{job}_*_log.out") for m in re.findall(r"\[launch\] (n\d) ", f.read_text())}
    assert len(ranks) == 2, ranks  # two nodes took part
    text = generate(run / "hf", "ROMEO:", tokens=20)
    assert text.startswith("ROMEO:") and len(text) > len("ROMEO:")
