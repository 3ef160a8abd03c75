"""The global batch fixed across layouts on the local cluster: the tiny config with global_batch 6 trains 6 steps on
2 nodes (dp=4: ranks take 2, 2, 1, 1 rows, accumulation 2), checkpointing at step 3; the same job name submitted
again on 1 node (dp=2: 3 rows each, accumulation 3) resumes that checkpoint, and its steps 4-6 have the losses of the
uninterrupted 2-node run (the data order does not depend on dp)."""

import json
import shutil

import pytest
from conftest import run_cli
from train_helpers import TINY

pytestmark = pytest.mark.slurm
TRAIN = (
    "global_batch=6",
    "micro_batch=1",
    "steps=6",
    "schedule.warmup_steps=2",
    "checkpoint.interval=3",
    "checkpoint.keep_last=3",
    "log.log_every=1",
)


def losses(path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def test_a_resume_on_fewer_nodes_keeps_the_global_batch(slurm, tmp_path):
    def submit(nodes: int):
        r = run_cli(
            "-m",
            "hpc.submit",
            "--site",
            "local",
            "--nodes",
            str(nodes),
            "--job-name",
            "batch",
            "--wait",
            "--",
            "--config",
            str(TINY),
            *TRAIN,
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr
        return r

    first = submit(2)
    assert "global_batch 6 = dp 4 x 1-2 rows, grad accumulation 2" in first.stdout
    assert "hpc.submit: note: trainer: global_batch=6 does not split evenly over dp=4" in first.stderr
    run = tmp_path / "jobs" / "batch"
    uninterrupted = losses(run / "metrics.jsonl")
    assert sorted(uninterrupted) == [1, 2, 3, 4, 5, 6]
    shutil.rmtree(tmp_path / "checkpoints" / "batch" / "step-00000006")  # back to step 3
    second = submit(1)
    assert "resumed from" in second.stdout and "(step 3, saved under dp=4 x tp=1)" in second.stdout
    assert "the same global_batch 6: grad accumulation 3 at dp=2 (it was 2 at dp=4)" in second.stdout
    resumed = losses(run / "metrics.jsonl")
    assert max(abs(resumed[k] - uninterrupted[k]) for k in (4, 5, 6)) < 1e-5, (resumed, uninterrupted)
