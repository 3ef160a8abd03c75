"""Experiment trackers (log.tracker) of a job requeued on the local cluster: one run each, every step once."""

import json
import re
import subprocess

import pytest
from train_helpers import REPEATABLE, TINY, items, logged, metrics

pytest.importorskip("mlflow")
pytest.importorskip("wandb")
from conftest import run_cli, wait_job
from mlflow.tracking import MlflowClient

from slurm.requeue_checks import restarts, steps_done, wait_for
from train.tracking import wandb_records, wandb_run_files


def test_scontrol_requeue_continues_the_tracker_runs(slurm, tmp_path, monkeypatch):
    """A job on the local cluster requeued mid-run: one MLflow run (experiment = the job name) and one W&B run id,
    every step once, values equal to metrics.jsonl."""
    steps, name = 30, f"track-requeue-{tmp_path.name}"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--job-name",
        name,
        "--max-requeues",
        "5",
        "--",
        "--config",
        str(TINY),
        f"steps={steps}",
        "checkpoint.interval=5",
        "log.log_every=5",
        "log.tracker=[mlflow, wandb, tensorboard]",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.split("submitted job ")[1].split()[0]
    run = tmp_path / "jobs" / name
    wait_for(lambda: steps_done(run) >= 8, what="8 steps")
    subprocess.run(["scontrol", "requeue", job], check=True)
    state = wait_job(job, timeout=600)
    out = (run / f"{job}_0_log.out").read_text()
    assert state == "COMPLETED", out[-3000:]
    assert restarts(job) >= 1 and "resumed from" in out
    jsonl = metrics(run)
    assert sorted(jsonl) == list(range(1, steps + 1))
    resumed = int(re.search(r"resumed from \S+ \(step (\d+),", out).group(1))
    want = logged(jsonl)
    # a tracker keeps its first values of steps trained again after the resume (none if the stop saved a checkpoint)
    first_kept = {k: {s: v for s, v in values.items() if k in REPEATABLE or s <= resumed} for k, values in want.items()}

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    for key, values in want.items():
        history = {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, key)}
        assert len(history) == len(client.get_metric_history(runs[0].info.run_id, key)), key  # each step once
        assert sorted(history) == sorted(values), key
        assert {s: v for s, v in history.items() if s in first_kept[key]} == first_kept[key], key

    ids = {
        json.loads((d / "meta.json").read_text())["tracker"]["wandb"]
        for d in (tmp_path / "checkpoints" / name).glob("step-*")
    }
    assert len(ids) == 1
    files = wandb_run_files(run, ids.pop())
    history = [
        items(rec.history.item) for f in files for rec in wandb_records(f) if rec.WhichOneof("record_type") == "history"
    ]
    assert [h["_step"] for h in history] == list(range(1, steps + 1))
    got = {k: {h["_step"]: h[k] for h in history if k in h} for k in want}
    assert {k: {s: v for s, v in got[k].items() if s in first_kept[k]} for k in want} == first_kept
    notes = "; ".join(line for line in out.splitlines() if line.startswith("[track]"))
    print(
        f"\n[track] job {job}: {restarts(job)} restart(s), resumed at step {resumed}, {len(files)} W&B run files; "
        f"{notes}"
    )
