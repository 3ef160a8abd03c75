"""A run's metrics.jsonl (one JSON object per step): read, summarise, plot, export to TensorBoard.

Keys the trainer writes: step, loss, loss_tokens, tokens_per_s, mfu (null without a known GPU
peak), lr, grad_norm (and step_time_s, peak_mem_gib; eval_loss at evaluated steps; stragglers at the
steps where train/straggler.py named a slow rank). A requeued run resumes
from its last checkpoint and logs some steps again: the last record of a step wins.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Optional

from hpc.node.cli import HpcError
from hpc.node.files import NotASmallFile, read_range
from hpc.tensorboard_events import write_scalars

CAUSES = {"compute": "its computation slower", "host": "late, its computation not slower: a host-side stall"}
PLOTTED = (("loss", "loss"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"))
METRICS_BYTES = 256 << 20  # of metrics.jsonl, its newest records (a few hundred bytes a step)
SUMMARY = ("loss", "tokens_per_s", "mfu", "lr", "grad_norm", "eval_loss")


def read_metrics(path: Path) -> list[dict]:
    """Records by step, the last one of each step; a partly written last line is left for later."""
    try:
        data, skipped = read_range(path, None, METRICS_BYTES)
    except FileNotFoundError:
        return []
    except (OSError, NotASmallFile) as e:
        raise HpcError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    text = data.decode("utf-8", errors="replace")
    if skipped:  # its newest records: the first line read may be the end of one
        text = text.partition("\n")[2]
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]
    by_step: dict[int, dict] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # also a number of over 4300 digits, or nesting past Python's stack
            raise HpcError(f"{path} line {n} is not JSON: {line[:80]!r}") from None
        try:
            by_step[int(rec["step"])] = rec
        except (KeyError, TypeError, ValueError):  # a ValueError here would not reach hpc.jobs' one-line errors
            raise HpcError(f"{path} line {n} has no whole-number step: {line[:80]!r}") from None
    return [by_step[s] for s in sorted(by_step)]


def fmt(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def last_line(records: list[dict]) -> str:
    """The latest step in one line: step, loss, tokens/s, MFU."""
    r = records[-1]
    mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    return f"step {r['step']}: loss {fmt(r.get('loss'))}, {fmt(r.get('tokens_per_s'))} tokens/s, MFU {mfu}"


def summary_table(records: list[dict]) -> str:
    """first / last / min / max / mean of each summarised metric, as aligned text."""
    rows = [("metric", "first", "last", "min", "max", "mean")]
    for key in SUMMARY:
        values = [r.get(key) for r in records]
        known = [v for v in values if v is not None]
        if not known:
            rows.append((key, "n/a", "n/a", "n/a", "n/a", "n/a"))
            continue
        rows.append(
            (key, fmt(values[0]), fmt(values[-1]), fmt(min(known)), fmt(max(known)), fmt(statistics.fmean(known)))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=False))
        ).rstrip()
        for row in rows
    )


def straggler_lines(records: list[dict]) -> list[str]:
    """One line per rank the trainer named a straggler (``stragglers`` records): its node, the steps it was named at,
    and how much slower it was than the others' median at most and when last named."""
    named: dict[tuple, list] = {}
    for r in records:
        for f in r.get("stragglers") or []:
            named.setdefault((f["rank"], f["node"]), []).append((r["step"], f))
    lines = []
    for (rank, node), hits in sorted(named.items()):
        steps = [s for s, _ in hits]
        worst = max(f["slower"] for _, f in hits)
        last = hits[-1][1]
        cause = f" ({CAUSES[last['cause']]})" if last.get("cause") in CAUSES else ""
        lines.append(
            f"straggler: rank {rank} on {node}{cause}, named at {len(steps)} window(s), steps {steps[0]}-{steps[-1]}; "
            f"{100 * last['slower']:.0f}% slower than the median over {last['windows']} windows when last named "
            f"(at most {100 * worst:.0f}%)"
        )
    return lines


def plot(records: list[dict], out: Path, title: str) -> None:
    """loss (and eval loss), tokens/s and MFU against the step, one panel each, into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PLOTTED), 1, figsize=(8, 2.6 * len(PLOTTED)), sharex=True)
    for ax, (key, label) in zip(axes, PLOTTED, strict=False):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=False), marker=".", linewidth=1, label=label)
            evaluated = [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None]
            if key == "loss" and evaluated:
                ax.plot(*zip(*evaluated, strict=False), marker="o", linewidth=1, label="eval loss")
                ax.legend()
        else:
            ax.text(0.5, 0.5, f"{label}: not reported", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def to_tensorboard(records: list[dict], logdir: Path) -> int:
    """Every numeric metric as a TensorBoard scalar ``train/<key>`` at its step; returns the scalars written."""
    scalars = [
        (r["step"], f"train/{key}", value)
        for r in records
        for key, value in r.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]
    write_scalars(logdir, scalars)
    return len(scalars)
