"""Experiment trackers (log.tracker) on a real 2-rank CPU run, read back with each tracker's own client or format.

The run is resumed from an older checkpoint (steps 4-6 run twice): the tracker runs must continue
(same run ids in every checkpoint), hold every step once, and the values must be those of metrics.jsonl.
"""

import json
import math
import shutil
import subprocess
import sys
import time

import pytest
from train_helpers import REPEATABLE, ROOT, TINY, clean_env, finish, items, launch, logged, metrics

pytest.importorskip("mlflow")
pytest.importorskip("wandb")
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from train.tracking import wandb_records, wandb_run_files

STEPS = 6
OVERRIDES = (
    f"steps={STEPS}",
    "checkpoint.interval=3",
    "checkpoint.keep_last=3",
    "log.log_every=2",
    "log.tracker=[mlflow, wandb, tensorboard]",
)


def tracker_ids(run, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step-{step:08d}" / "meta.json").read_text())["tracker"]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """Train 6 steps (checkpoints at 3 and 6), drop the step-6 checkpoint as if the job had died before saving it,
    run again: the second attempt resumes at step 3 and trains 4-6 anew. Returns (run dir, first attempt's metrics,
    output)."""
    run = tmp_path_factory.mktemp("tracked") / "run"
    with pytest.MonkeyPatch.context() as mp:
        for var in ("SLURM_JOB_NAME", "PBS_JOBNAME"):  # no batch job: the experiment is named after the run directory
            mp.delenv(var, raising=False)
        finish(launch(2, run, *OVERRIDES), run)
        first = metrics(run)
        assert tracker_ids(run, 3) == tracker_ids(run, 6)
        shutil.rmtree(run / "checkpoints" / "step-00000006")
        out = finish(launch(2, run, *OVERRIDES), run)
    return run, first, out


def test_resume_continues_the_tracker_runs(resumed_run):
    run, first, out = resumed_run
    assert "resumed from" in out and "(step 3," in out
    assert "[track] mlflow: the run holds steps 4-6 already" in out
    assert "[track] wandb: the run holds steps 4-6 already" in out
    ids = tracker_ids(run, 6)
    assert set(ids) == {"mlflow", "wandb"} and ids == tracker_ids(run, 3)
    second = metrics(run)
    assert sorted(second) == list(range(1, STEPS + 1))
    for step in second:
        assert {k: second[step][k] for k in REPEATABLE} == {k: first[step][k] for k in REPEATABLE}, step


def test_mlflow_store_holds_every_step_once(resumed_run, monkeypatch):
    run, first, _ = resumed_run
    run_id = tracker_ids(run, 6)["mlflow"]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only with this opt-in
    client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
    experiments = [e for e in client.search_experiments() if e.name != "Default"]
    assert [e.name for e in experiments] == [run.name]
    runs = client.search_runs([experiments[0].experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # one run across both attempts
    tracked = runs[0]
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == run.name
    params = tracked.data.params
    assert (params["steps"], params["optim.lr"], params["model.shape"], params["log.tracker"]) == (
        "6",
        "0.001",
        "tiny",
        '["mlflow", "wandb", "tensorboard"]',
    )
    want = logged(first)  # the first attempt's values, kept for steps 4-6 (equal where training repeats bit for bit)
    assert {"loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "samples_consumed", "wait_s"} <= set(want)
    assert "mfu" not in want  # None on CPU: not a number, not logged
    assert set(tracked.data.metrics) == set(want)
    for key, values in want.items():
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == sorted(values), key  # each step once
        assert {m.step: m.value for m in history} == values, key


def test_wandb_offline_run_holds_every_step_once(resumed_run):
    run, first, _ = resumed_run
    run_id = tracker_ids(run, 6)["wandb"]
    files = wandb_run_files(run, run_id)
    assert len(files) == 2 and all(f.parent.name.startswith("offline-run-") for f in files)  # one per attempt
    history, configs = [], []
    for f in files:
        for record in wandb_records(f):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                assert record.run.run_id == run_id and record.run.project == "hpc-train"
                configs.append(items(record.run.config.update))
            elif kind == "history":
                history.append(items(record.history.item))
    assert [h["_step"] for h in history] == list(range(1, STEPS + 1))
    got = {}
    for h in history:
        for k, v in h.items():
            if not k.startswith("_"):
                got.setdefault(k, {})[h["_step"]] = v
    assert got == logged(first)
    assert len(configs) == 2 and all(c["steps"] == STEPS and c["optim"]["lr"] == 1e-3 for c in configs)


def test_tensorboard_rewrites_the_repeated_steps(resumed_run):
    run, first, _ = resumed_run
    second = metrics(run)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    want = logged(second)
    assert set(events.Tags()["scalars"]) == set(want)
    for key, values in want.items():
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == sorted(values), key  # steps 4-6 of the first attempt purged
        for s in scalars:  # float32 in the event file; the second attempt's values (its timing for steps 4-6)
            assert math.isclose(s.value, values[s.step], rel_tol=1e-6), (key, s.step)


def test_tracker_not_installed_is_one_line_exit_2(tmp_path):
    """A configured tracker whose package is missing (here hidden from import) stops every rank at config validation."""
    hide = "import sys; sys.modules['wandb'] = None; from train.__main__ import main; sys.exit(main())"
    run = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-c", hide, "--config", str(TINY), f"log.dir={run}", "log.tracker=[mlflow, wandb]"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"train: error: {TINY} (with overrides log.dir={run} log.tracker=[mlflow, wandb]): "
        "log.tracker: wandb is not installed; pip install 'hpc-train[wandb]'"
    ]
    assert not run.exists()


def test_wandb_run_file_reader_across_blocks(tmp_path, monkeypatch):
    """Records longer than the run file's 32 KiB blocks (split into first/middle/last chunks) read back whole."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    big = "".join(chr(ord("a") + i % 26) for i in range(100_000))
    run = wandb.init(
        project="reader", dir=str(tmp_path), config={"big": big}, settings=wandb.Settings(console="off", silent=True)
    )
    for step in range(1, 200):
        run.log({"x": step / 7, "blob": big[: step * 300]}, step=step)
    run.finish()
    wandb.teardown()  # waits until W&B's service process wrote the run file
    files = wandb_run_files(tmp_path, run.id)
    assert len(files) == 1 and files[0].stat().st_size > 4 * 32768
    records = list(wandb_records(files[0]))
    (config,) = [items(r.run.config.update) for r in records if r.WhichOneof("record_type") == "run"]
    assert config["big"] == big
    history = [items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["x"], h["blob"]) for h in history] == [(s, s / 7, big[: s * 300]) for s in range(1, 200)]


def test_steps_a_tracker_missed_are_sent_at_the_next_start(tmp_path, monkeypatch):
    """An attempt whose trackers stopped after step 5 while metrics.jsonl went on to the checkpoint at step 8: the next
    start (resume_step 8) sends steps 6-8 from metrics.jsonl, and only those, to the same runs."""
    from train.front.config import load_config
    from train.metrics import MetricsLog
    from train.tracking import Tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("SLURM_JOB_NAME", raising=False)
    cfg = load_config(TINY, [f"log.dir={tmp_path}", "log.tracker=[mlflow, wandb]", "steps=12"])
    records = [{"step": s, "loss": 8 - s / 10, "lr": 1e-3 * s} for s in range(1, 9)]
    first = Tracking(cfg, {}, 0)
    for record in records[:5]:
        first.log(record)
    first.close()
    time.sleep(1.1)  # W&B names a run's directory by its start second; attempts of a job start seconds apart
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 9, "loss"')
    ids = first.run_ids()

    again = Tracking(cfg, ids, 8)
    assert again.run_ids() == ids
    log = MetricsLog(
        tmp_path,
        True,
        10,
        12,
        tokens_per_step=256,
        flops_per_token=1.0,
        peak_flops_total=None,
        resume_step=8,
        tracking=again,
    )
    log.log({"step": 9, "loss": 7.0, "lr": 9e-3})
    log.close()

    want = {s: 8 - s / 10 for s in range(1, 9)} | {9: 7.0}
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    history = client.get_metric_history(ids["mlflow"], "loss")
    assert sorted(m.step for m in history) == list(range(1, 10))
    assert {m.step: m.value for m in history} == want
    assert client.get_run(ids["mlflow"]).info.status == "KILLED"  # stopped before steps=12
    steps = [
        items(r.history.item)
        for f in wandb_run_files(tmp_path, ids["wandb"])
        for r in wandb_records(f)
        if r.WhichOneof("record_type") == "history"
    ]
    assert [h["_step"] for h in steps] == list(range(1, 10))
    assert {h["_step"]: h["loss"] for h in steps} == want
