"""Experiment trackers (``log.tracker``): MLflow, Weights & Biases, TensorBoard, fed by rank 0's metrics log.

Each tracker gets every step's numeric metrics as they are written to metrics.jsonl, and the run
config as params. The MLflow and W&B run ids are saved in the checkpoint's meta.json, so a resumed
job continues the same tracker run; a step is recorded there once:

- MLflow and W&B keep the value first logged: steps that the run already holds (logged after the
  checkpoint the job resumes from) are not sent again. MLflow is asked for its last step; W&B's run
  files (offline or not, one directory per process) are read back.
- TensorBoard overwrites: the writer purges the events after the resumed step, the steps are logged anew.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from train.front.config import TrainConfig


def job_name(run_dir: Path) -> str:
    """The batch job's name (Slurm, else PBS), else the run directory's name."""
    return os.environ.get("SLURM_JOB_NAME") or os.environ.get("PBS_JOBNAME") or Path(run_dir).resolve().name


def flat_params(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as ``a.b: value`` strings."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


def numeric(record: dict) -> dict[str, float]:
    """The record's numeric values except the step (None, e.g. mfu on CPU, is left out)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class MLflowTracker:
    """A run in ``log.mlflow_uri`` (default: the file store ``<log.dir>/mlruns``), experiment = the job name."""

    name = "mlflow"

    def __init__(self, run_dir: Path, uri: str | None, run_id: str | None, params: dict[str, str]):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants an opt-in for file stores
        uri = uri or (Path(run_dir) / "mlruns").resolve().as_uri()
        from mlflow.entities import Metric, Param, RunStatus
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self._Metric, self._status = Metric, RunStatus
        self.client = MlflowClient(tracking_uri=uri)
        run = None
        if run_id is not None:
            try:
                run = self.client.get_run(run_id)
            except MlflowException:
                print(f"[track] mlflow: run {run_id} of the checkpoint is not in {uri}; starting a new run", flush=True)
        if run is None:
            run = self.client.create_run(
                self._experiment(job_name(run_dir), MlflowException), run_name=Path(run_dir).resolve().name
            )
        self.run_id = run.info.run_id
        self.client.update_run(self.run_id, status="RUNNING")
        held = run.data.params
        changed = sorted(k for k in params if k in held and held[k] != params[k])
        if changed:  # MLflow params cannot change; the first attempt's stay
            print(f"[track] mlflow: params keep their first values, changed since: {', '.join(changed)}", flush=True)
        new = [Param(k, v) for k, v in params.items() if k not in held]
        for i in range(0, len(new), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=new[i : i + 100])
        keys = ["loss"] if "loss" in run.data.metrics else run.data.metrics  # every trainer record has a loss
        self.last_step = max(
            (m.step for key in keys for m in self.client.get_metric_history(self.run_id, key)), default=0
        )

    def _experiment(self, name: str, error: type[Exception]) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except error:  # another job created it meanwhile
            return self.client.get_experiment_by_name(name).experiment_id

    def log(self, step: int, values: dict[str, float]) -> None:
        ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._Metric(k, v, ms, step) for k, v in values.items()])

    def close(self, finished: bool) -> None:
        self.client.set_terminated(
            self.run_id, self._status.to_string(self._status.FINISHED if finished else self._status.KILLED)
        )


def wandb_records(path: Path) -> Iterator:
    """The protobuf records (``wandb.proto.wandb_internal_pb2.Record``) of a W&B run file ``run-<id>.wandb``.

    The file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks, each with a 7-byte
    header (checksum, little-endian length, type: 1 whole record, 2 first, 3 middle, 4 last part)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, parts = Path(path).read_bytes(), 32768, 7, b""
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0 or len(chunk) < length:  # zero padding, or a record cut short by a killed process
            break
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


def wandb_run_files(run_dir: Path, run_id: str) -> list[Path]:
    """The run files of ``run_id`` under ``<run_dir>/wandb``, one per process that wrote the run, oldest first."""
    return sorted(Path(run_dir).glob(f"wandb/*-{run_id}/run-{run_id}.wandb"))


class WandbTracker:
    """A W&B run, offline unless WANDB_MODE says otherwise (``wandb sync <log.dir>/wandb`` uploads it later)."""

    name = "wandb"

    def __init__(self, run_dir: Path, project: str, run_id: str | None, params: dict):
        import wandb

        self.run_dir = Path(run_dir)
        self.last_step = 0
        if run_id is not None:
            self.last_step = max(
                (
                    int(r.history.step.num)
                    for f in wandb_run_files(self.run_dir, run_id)
                    for r in wandb_records(f)
                    if r.WhichOneof("record_type") == "history"
                ),
                default=0,
            )
        self.run = wandb.init(
            project=project,
            dir=str(self.run_dir),
            id=run_id,
            resume="allow",
            name=self.run_dir.resolve().name,
            group=job_name(run_dir),
            config=params,
            mode=os.environ.get("WANDB_MODE", "offline"),
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run_id = self.run.id

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self, finished: bool) -> None:
        import wandb

        self.run.finish(exit_code=0 if finished else 1)
        wandb.teardown()  # finish returns before W&B's service process wrote the run file; this waits for it


class TensorBoardTracker:
    """Event files in ``<log.dir>/tensorboard``; events after the resumed step are purged and written again."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, resume_step: int, config_yaml: str):
        from torch.utils.tensorboard import SummaryWriter

        # flushed every 10 s (not TensorBoard's 120 s): live, and little lost to a kill
        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_step + 1, flush_secs=10)
        self.last_step = resume_step
        self.writer.add_text("config", "```\n" + config_yaml + "```", resume_step)
        self.run_id = None

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self, finished: bool) -> None:
        self.writer.close()


class Tracking:
    """The configured trackers of rank 0: ``log`` each written record, ``run_ids`` for the checkpoint, ``close`` at the
    end.

    A tracker never stops training: one that fails (to start, or later: a server gone, W&B's service process
    killed by the job's signal) is reported in one line and left out for the rest of this process. Its steps
    are sent at the next start, from metrics.jsonl (``MetricsLog`` passes the records it keeps there)."""

    def __init__(self, cfg: TrainConfig, run_ids: dict[str, str], resume_step: int):
        run_dir, config = Path(cfg.log.dir), cfg.model_dump(mode="json")
        opener = {
            "mlflow": lambda: MLflowTracker(run_dir, cfg.log.mlflow_uri, run_ids.get("mlflow"), flat_params(config)),
            "wandb": lambda: WandbTracker(run_dir, cfg.log.wandb_project, run_ids.get("wandb"), config),
            "tensorboard": lambda: TensorBoardTracker(run_dir, resume_step, yaml.safe_dump(config, sort_keys=False)),
        }
        self.ids = dict(run_ids)  # kept for a tracker that fails or is left out, so a later start continues its run
        self.trackers = []
        for name in cfg.log.tracker:
            try:
                tracker = opener[name]()
            except Exception as e:  # any error of a tracker's client
                _report(name, "cannot start", e)
                continue
            self.trackers.append(tracker)
            if tracker.run_id is not None:
                self.ids[name] = tracker.run_id
            if tracker.last_step > resume_step:
                print(
                    f"[track] {name}: the run holds steps {resume_step + 1}-{tracker.last_step} already; they keep "
                    "their first values",
                    flush=True,
                )
        self.total_steps, self.step = cfg.steps, resume_step

    def run_ids(self) -> dict[str, str]:
        return dict(self.ids)

    def log(self, record: dict) -> None:
        """Send ``record`` to each tracker that does not hold its step yet."""
        values = numeric(record)
        self.step = record["step"]
        for t in list(self.trackers):
            if self.step > t.last_step:
                try:
                    t.log(self.step, values)
                except Exception as e:
                    _report(t.name, f"cannot log step {self.step}", e)
                    self.trackers.remove(t)
                    continue
                t.last_step = self.step

    def close(self) -> None:
        for t in self.trackers:
            try:
                t.close(finished=self.step >= self.total_steps)
            except Exception as e:
                _report(t.name, "cannot close its run", e)


def _report(name: str, what: str, error: Exception) -> None:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    print(f"[track] {name}: {what} ({type(error).__name__}: {first}); training goes on without it", flush=True)
