"""What a checkpoint was written with, checked against the run's settings before anything is loaded, renamed or
written; and starting over on purpose (``checkpoint.restart: fresh``), which moves the old run's files aside."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hpc.node.contract import CHECKPOINT_META, CHECKPOINT_PREFIX, FRESH_MARKER, METRICS_FILE
from hpc.node.files import META_BYTES, read_json_object
from train.front.config import TrainConfig

# The model config fields that decide the shapes of the saved state, and a mixture of experts' routing (which experts
# a token reaches and how their outputs are weighted: the trained state means something else under another).
STATE_DIMS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "num_experts",
    "moe_intermediate_size",
)
ROUTING_DIMS = ("num_experts_per_tok", "norm_topk_prob")
# Settings recorded since a later version: a checkpoint written before holds no value for them, and is not refused for
# it.
RECORDED_LATER = (*(f"model.dims.{k}" for k in ROUTING_DIMS), "global_batch")
_SHOWN = 60  # characters of a value in a message


def written_with(cfg: TrainConfig, config, lora: dict | None) -> dict:
    """The settings a checkpoint of this run is written with, by config key (``lora``: the adapters' settings and
    base, None for a full fine-tune); a key that is off is None, so a key added later reads the same in older
    checkpoints."""
    settings = {f"model.dims.{k}": getattr(config, k, None) for k in STATE_DIMS + ROUTING_DIMS}
    settings |= {"master_dtype": cfg.master_dtype, "fp8.enabled": cfg.fp8.enabled, "data.packed": cfg.data.packed}
    settings |= {"global_batch": cfg.global_batch}  # what a step trains; the layout and accumulation may change
    settings |= {f"lora.{k}": v for k, v in (lora or {}).items()}
    return json.loads(json.dumps(settings))  # as meta.json holds them


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def differences(saved: dict, now: dict) -> list[str]:
    """``key saved (saved) vs now (now)`` for each setting that differs."""
    return [
        f"{k} {_short(saved.get(k))} (saved) vs {_short(now.get(k))} (now)"
        for k in sorted(saved.keys() | now.keys())
        if saved.get(k) != now.get(k) and (k in saved or k not in RECORDED_LATER)
    ]


def mismatch(checkpoints: list[Path], now: dict) -> str | None:
    """The one-line refusal when a checkpoint was written with other settings than ``now``; None when all match.
    Checkpoints written before settings were recorded, or whose meta cannot be read, are left to the load."""
    for path in checkpoints:
        try:
            saved = read_json_object(path / CHECKPOINT_META, META_BYTES).get("written_with")
        except (OSError, ValueError):
            continue
        if isinstance(saved, dict) and (diffs := differences(saved, now)):
            return (
                f"checkpoint.dir {path.parent}: {path.name} was written with other settings: {'; '.join(diffs)}; "
                "set them back to resume it, or set checkpoint.restart=fresh to train from step 0 "
                "(the checkpoints are moved aside, not deleted)"
            )
    return None


def start_fresh(root: Path, log_dir: Path, job_id: str | None) -> str | None:
    """checkpoint.restart=fresh: move the checkpoints (complete, half-written, set aside) into
    ``<root>/before-fresh-<time>/`` and metrics.jsonl beside itself, unless this job did so already (a requeue of
    it goes on from its own checkpoints). Returns what was moved, for the log."""
    root, marker = Path(root), Path(root) / FRESH_MARKER
    if job_id is not None and marker.exists():
        try:
            if read_json_object(marker).get("job_id") == job_id:
                return None
        except (OSError, ValueError):
            pass
    stamp = time.strftime("%Y%m%d-%H%M%S")
    old = sorted(d for d in root.iterdir() if d.name.startswith(CHECKPOINT_PREFIX)) if root.is_dir() else []
    moved = []
    if old:
        archive = root / f"before-fresh-{stamp}"
        archive.mkdir()
        for d in old:
            os.replace(d, archive / d.name)
        moved.append(f"{len(old)} checkpoint(s) to {archive}")
    metrics = Path(log_dir) / METRICS_FILE
    if metrics.is_file():
        target = metrics.with_name(f"{METRICS_FILE}.before-fresh-{stamp}")
        os.replace(metrics, target)
        moved.append(f"{METRICS_FILE} to {target}")
    root.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"job_id": job_id, "at": stamp}) + "\n")
    return "; ".join(moved) or None
