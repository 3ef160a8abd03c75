"""All tasks of a sweep (an array job) side by side: one table sorted by final (eval) loss, one plot of every task's
loss."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpc.metrics_report import fmt, read_metrics
from hpc.node.contract import METRICS_FILE
from hpc.slurm_query import Job
from hpc.sweep import read_table


@dataclass(frozen=True)
class TaskRun:
    job: Job
    overrides: tuple[str, ...]
    run_dir: Optional[Path]
    records: list[dict]

    @property
    def final_loss(self) -> Optional[float]:
        """The last eval loss when the run evaluated, else the last training loss."""
        evals = [r["eval_loss"] for r in self.records if r.get("eval_loss") is not None]
        if evals:
            return evals[-1]
        return self.records[-1].get("loss") if self.records else None


def task_run_dir(job: Job) -> Optional[Path]:
    """An array task's run directory (its log.dir) from the sweep table in the job directory."""
    if job.job_dir is None or job.array_task is None:
        return None
    entry = read_table(job.job_dir).get(job.array_task)
    return job.job_dir / entry[1] if entry else None


def task_runs(jobs: list[Job]) -> list[TaskRun]:
    """Each task with its overrides and metrics, sorted by final (eval) loss; tasks without metrics last."""
    runs = []
    for job in jobs:
        table = read_table(job.job_dir) if job.job_dir else {}
        overrides, _ = table.get(job.array_task, ((), ""))
        run_dir = task_run_dir(job)
        runs.append(TaskRun(job, overrides, run_dir, read_metrics(run_dir / METRICS_FILE) if run_dir else []))
    return sorted(
        runs, key=lambda r: (r.final_loss is None, r.final_loss if r.final_loss is not None else 0, r.job.array_task)
    )


def sweep_table(runs: list[TaskRun]) -> str:
    """One row per task: id, state, restarts, overrides, steps, final loss (eval loss when evaluated), tokens/s."""
    rows = [("TASK", "STATE", "RESTARTS", "OVERRIDES", "STEP", "LOSS", "EVAL_LOSS", "TOKENS/S")]
    for r in runs:
        last = r.records[-1] if r.records else {}
        evals = [x["eval_loss"] for x in r.records if x.get("eval_loss") is not None]
        rows.append(
            (
                r.job.job_id,
                r.job.state.split()[0],
                str(r.job.restarts),
                " ".join(r.overrides) or "?",
                str(last.get("step", "-")),
                fmt(last.get("loss")) if last else "-",
                fmt(evals[-1]) if evals else "-",
                fmt(last.get("tokens_per_s")) if last else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows)


def plot_sweep(runs: list[TaskRun], out: Path, title: str) -> None:
    """Every task's loss against the step (eval loss dashed in the same colour), one curve per task, into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for r in runs:
        points = [(x["step"], x["loss"]) for x in r.records if x.get("loss") is not None]
        if not points:
            continue
        label = f"{r.job.job_id}: {' '.join(r.overrides)}"
        (line,) = ax.plot(*zip(*points, strict=False), linewidth=1, label=label)
        evals = [(x["step"], x["eval_loss"]) for x in r.records if x.get("eval_loss") is not None]
        if evals:
            ax.plot(
                *zip(*evals, strict=False),
                linestyle="--",
                marker="o",
                color=line.get_color(),
                linewidth=1,
                label=f"{label} (eval)",
            )
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
