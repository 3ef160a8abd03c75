"""Per-step metrics: FLOPs per token, MFU, peak memory; a JSONL file and a progress line on rank 0."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import torch

from hpc.node.cli import HpcError
from hpc.node.contract import METRICS_FILE
from hpc.node.files import regular_file_problem
from train.tracking import Tracking

# Dense peak FLOP/s per GPU for the 16-bit compute dtype (bf16), by a substring of the device name.
PEAK_FLOPS_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
}


def flops_per_token(params: dict[str, int], num_layers: int, num_heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (active non-embedding params + lm_head params) + 12 x layers x heads x head_dim x
    seq_len.

    Active parameters are those one token passes through: all of a dense model's; of a mixture of experts, the
    attention, norms, routers and top-k of the E experts per MoE layer (k/E of the expert weights)."""
    return 6 * (params["active_non_embedding"] + params["lm_head"]) + 12 * num_layers * num_heads * head_dim * seq_len


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of one accelerator, or None (CPU, or a GPU not in the table)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS_BF16.items() if k in name), None)


def peak_memory_gib(device: torch.device) -> float:
    """CUDA max allocated memory on GPU, peak process RSS on CPU, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


class MetricsLog:
    """Appends one JSON record per step to ``<run_dir>/metrics.jsonl``, hands it to the experiment trackers (if any),
    and
    prints a progress line every ``log_every`` steps (rank 0 only).

    Records may hold device tensors (loss, grad norm). They are read, which waits for the
    device, only every ``sync_every`` steps, at progress lines and on ``flush``; the wall time
    since the previous read is split evenly over those steps for step time, tokens/s and MFU.
    """

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        log_every: int,
        total_steps: int,
        *,
        tokens_per_step: int,
        flops_per_token: float,
        peak_flops_total: float | None,
        resume_step: int = 0,
        sync_every: int = 1,
        tracking: Tracking | None = None,
    ):
        self.enabled, self.log_every, self.total_steps = enabled, log_every, total_steps
        self.tokens_per_step, self.flops_per_token, self.peak_flops_total = (
            tokens_per_step,
            flops_per_token,
            peak_flops_total,
        )
        self.sync_every, self.tracking = sync_every, tracking
        self._pending: list[dict] = []
        self.restart_clock()
        self.path = Path(run_dir) / METRICS_FILE
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = self._keep_until(resume_step)
            if tracking is not None:  # steps a tracker missed before the resume (it skips those it holds)
                for record in kept:
                    tracking.log(record)
            self._file = self.path.open("a", buffering=1)

    def _keep_until(self, step: int) -> list[dict]:
        """Drop records after the resumed step (a stopped run logged them past its last checkpoint); returns those kept.
        The kept lines go to a new file that replaces the old one; a line that is not JSON (cut short when the process
        was killed, or damaged) is appended to ``metrics.jsonl.unreadable`` and named in the log, never dropped."""
        if not self.path.exists():
            return []
        problem = regular_file_problem(self.path)
        if problem:  # reading a FIFO would block the start
            raise HpcError(f"log.dir: {self.path} is {problem}, not the run's metrics file")
        kept, records, unreadable = [], [], []
        for number, line in enumerate(self.path.read_text(errors="replace").splitlines(), 1):
            try:
                record = json.loads(line)
                record_step = record.get("step", 0)
            except (json.JSONDecodeError, AttributeError):
                unreadable.append(line + "\n")
                print(
                    f"[train] {self.path}: line {number} is not a metrics record; kept in {self.path.name}.unreadable",
                    flush=True,
                )
                continue
            if isinstance(record_step, int) and record_step <= step:
                kept.append(line + "\n")
                records.append(record)
        if unreadable:
            with self.path.with_name(self.path.name + ".unreadable").open("a") as side:
                side.writelines(unreadable)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.path)
        return records

    def restart_clock(self) -> None:
        """Start the next timing window now (after work that is not training, e.g. a checkpoint save)."""
        self._t0 = time.perf_counter()

    def untimed(self, fn):
        """Run ``fn`` (e.g. an evaluation) without counting its time in the step time, tokens/s and MFU; returns its
        result."""
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self._t0 += time.perf_counter() - t0

    def log(self, record: dict) -> None:
        self._pending.append(record)
        step = record["step"]
        if len(self._pending) >= self.sync_every or step % self.log_every == 0 or step == self.total_steps:
            self.flush()

    def flush(self) -> None:
        """Read the pending records' device values, time them, write them."""
        if not self._pending:
            return
        records = [{k: v.item() if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in self._pending]
        now = time.perf_counter()
        dt = (now - self._t0) / len(records)
        self._t0 = now
        self._pending.clear()
        tokens_per_s = self.tokens_per_step / dt
        mfu = None if self.peak_flops_total is None else tokens_per_s * self.flops_per_token / self.peak_flops_total
        for record in records:
            record.update(step_time_s=dt, tokens_per_s=tokens_per_s, mfu=mfu)
            if self.enabled:
                self._write(record)

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        if self.tracking is not None:
            self.tracking.log(record)
        step = record["step"]
        if step % self.log_every == 0 or step == self.total_steps:
            mfu = "n/a" if record["mfu"] is None else f"{100 * record['mfu']:.1f}%"
            split = ""
            if "wait_s" in record:
                share = record["wait_s"] / max(record["compute_s"] + record["wait_s"], 1e-9)
                split = (
                    f" | compute {record['compute_s']:.3f}s wait {record['wait_s']:.3f}s ({100 * share:.0f}% waiting)"
                )
            evaluated = f" | eval {record['eval_loss']:.4f}" if record.get("eval_loss") is not None else ""
            print(
                f"step {step}/{self.total_steps} | loss {record['loss']:.4f}{evaluated} | lr {record['lr']:.2e} | "
                f"gnorm {record['grad_norm']:.3f} "
                f"| {record['tokens_per_s']:,.0f} tok/s | mfu {mfu} | mem {record['peak_mem_gib']:.2f} GiB{split}",
                flush=True,
            )

    def event(self, record: dict) -> None:
        """Write the pending steps, then ``record`` (an event: {"step": ..., "event": ..., ...}) as it is."""
        self.flush()
        if self.enabled:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.flush()
        if self.enabled:
            self._file.close()
        if self.tracking is not None:
            self.tracking.close()
