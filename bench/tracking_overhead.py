"""What the experiment trackers cost rank 0 per metrics record, against writing metrics.jsonl alone.

    python bench/tracking_overhead.py [--records 500] [--out FILE]

Each case feeds the same trainer-like records (12 numeric values) through ``MetricsLog`` (one
flush per record, as on CPU) into a fresh log directory: jsonl only, then with each tracker
(MLflow file store, W&B offline, TensorBoard). Prints JSON (and writes it to --out): start and
close seconds, milliseconds per record, and the extra milliseconds per record over jsonl only.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hpc.node.cli import Parser, whole
from train.front.config import load_config, missing_packages
from train.metrics import MetricsLog
from train.tracking import Tracking

ROOT = Path(__file__).resolve().parent.parent

RECORD = {
    "loss": 7.5,
    "grad_norm": 1.2,
    "lr": 1e-3,
    "epoch": 0,
    "samples_consumed": 8,
    "peak_mem_gib": 0.5,
    "compute_s": 0.05,
    "wait_s": 0.05,
}  # MetricsLog adds step_time_s, tokens_per_s, mfu


def case(tracker: str | None, records: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tracking-bench-", ignore_cleanup_errors=True) as run_dir:
        cfg = load_config(
            ROOT / "train" / "configs" / "tiny.yaml", [f"log.dir={run_dir}", f"log.tracker=[{tracker or ''}]"]
        )
        t0 = time.perf_counter()
        tracking = Tracking(cfg, {}, 0) if tracker else None
        start_s = time.perf_counter() - t0
        log = MetricsLog(
            Path(run_dir),
            True,
            log_every=10**9,
            total_steps=10**9,
            tokens_per_step=256,
            flops_per_token=1e6,
            peak_flops_total=1e12,
            tracking=tracking,
        )
        t0 = time.perf_counter()
        for step in range(1, records + 1):
            log.log({"step": step, **RECORD})
        per_record_ms = (time.perf_counter() - t0) / records * 1e3
        t0 = time.perf_counter()
        log.close()
        return {
            "start_s": round(start_s, 3),
            "per_record_ms": round(per_record_ms, 3),
            "close_s": round(time.perf_counter() - t0, 3),
        }


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=whole(1), default=500)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-cpu-tracking.json"
    )
    a = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    absent = missing_packages(["mlflow", "wandb", "tensorboard"])
    if absent:
        sys.exit(f"error: {', '.join(absent)} not installed; pip install 'hpc-train[mlflow,wandb,tensorboard]'")
    cases = {name or "jsonl": case(name, a.records) for name in (None, "mlflow", "wandb", "tensorboard")}
    base = cases["jsonl"]["per_record_ms"]
    for result in cases.values():
        result["extra_ms_per_record"] = round(result["per_record_ms"] - base, 3)
    out = {"records": a.records, "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "cases": cases}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
