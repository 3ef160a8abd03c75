"""train.prepare at scale on the local cluster: one task here, then 1, 2 and 4 nodes (2 tasks each) through hpc.submit;
the outputs byte-identical; the trainer's start-up and memory on the prepared data against a small corpus.

    python bench/prepare_bench.py [--mb 64] [--format text|chat] [--chunk-mb 4] [--nodes 1 2 4] [--no-here]
                                  [--small-mb 1] [--site local] [--workdir DIR] [--out FILE]

The text corpus is the demo corpus's paragraphs, repeated (each copy numbered) into JSONL documents of about 2 kB; the
chat corpus is the demo chat set, repeated (each copy's answers numbered); either until it holds ``--mb`` MB. Packed by
document at seq_len 1024, chunks of ``--chunk-mb`` MiB. Needs the local cluster (source /tmp/hpc-slurm/env.sh). Prints
JSON and writes it to bench/results/<date>-prepare-local.json (or --out).
Per run: the job's wall time (submission to end: Slurm start, imports, preparation), every task's own preparation time
(wall and CPU), and the load average before and after; one_task_over_slowest_task compares the slowest task's time with
the single task's here (or, with --no-here, the total CPU time of the first run's tasks). On a machine with fewer
cores than tasks the tasks run partly one after another, so that ratio is not the job's speed-up.
Start-up: ``python -m train`` for one step (one process, the tiny model) on the corpus and on a ``--small-mb`` corpus:
seconds from process start to the first step, to the data opened (tokenizer, manifest check, memory maps, stream), and
the process's max RSS.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hpc.node.cli import Parser, number, whole
from hpc.node.contract import PREPARED_MANIFEST, task_log
from hpc.node.ownership import run_dir_name

ROOT = Path(__file__).resolve().parent.parent

SEQ = 1024


def make_corpus(path: Path, mb: float, fmt: str = "text") -> int:
    if fmt == "chat":
        return make_chat_corpus(path, mb)
    from train.front.data_sources import DEMO_CORPUS

    paras = [p for line in DEMO_CORPUS.open() for p in json.loads(line)["text"].split("\n\n") if p.strip()]
    target, size, copy = int(mb * 1e6), 0, 0
    with path.open("w") as f:
        while size < target:
            doc: list[str] = []
            for p in paras:
                doc.append(p)
                if sum(map(len, doc)) > 2000:
                    line = json.dumps({"text": f"[{copy}]\n" + "\n\n".join(doc)}) + "\n"
                    f.write(line)
                    size += len(line)
                    doc = []
                    if size >= target:
                        break
            copy += 1
    return size


def make_chat_corpus(path: Path, mb: float) -> int:
    from train.front.data_sources import DEMO_CHAT

    records = [json.loads(line) for line in DEMO_CHAT.open()]
    target, size, copy = int(mb * 1e6), 0, 0
    with path.open("w") as f:
        while size < target:
            for record in records:
                turns = [
                    {**t, "content": f"[{copy}] {t['content']}"} if t["role"] == "assistant" else t
                    for t in record["messages"]
                ]
                line = json.dumps({"messages": turns}) + "\n"
                f.write(line)
                size += len(line)
                if size >= target:
                    break
            copy += 1
    return size


def task_times(log: str) -> list[dict]:
    """Each task's own preparation time, wall and CPU, from its log line."""
    found = re.findall(r"\[prepare\] task (\d+)/\d+: (\d+) of \d+ chunks of .* in ([\d.]+)s \(cpu ([\d.]+)s\)", log)
    return sorted(
        ({"task": int(t), "chunks": int(n), "wall_s": float(w), "cpu_s": float(c)} for t, n, w, c in found),
        key=lambda d: d["task"],
    )


def digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.iterdir()):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def data_args(src: Path, out: Path, chunk: int, fmt: str) -> list[str]:
    return [
        f"data.path={src}",
        f"data.prepared={out}",
        f"data.format={fmt}",
        "data.pack=documents",
        f"seq_len={SEQ}",
        f"data.chunk_bytes={chunk}",
    ]


def prepare_cmd(src: Path, out: Path, chunk: int, fmt: str) -> list[str]:
    return ["-m", "train.prepare", "--config", str(ROOT / "train/configs/tiny.yaml"), *data_args(src, out, chunk, fmt)]


def startup(src: Path, out: Path, chunk: int, fmt: str, run_dir: Path, env: dict) -> dict:
    """One training step on the prepared data in a fresh process: seconds from its start to each log line that marks a
    stage (layout = imports and process group done; data opened; first step done), and its max RSS."""
    cmd = [
        sys.executable,
        "-m",
        "train",
        "--config",
        str(ROOT / "train/configs/tiny.yaml"),
        *data_args(src, out, chunk, fmt),
        f"log.dir={run_dir}",
        "steps=1",
        "schedule.warmup_steps=0",
        "log.log_every=1",
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=run_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    at: dict[str, float] = {}
    lines: list[str] = []
    marks = {"layout": "[train] layout", "data_opened": "[train] data:", "first_step": "step 1"}
    for line in proc.stdout:
        lines.append(line)
        for name, mark in marks.items():
            if name not in at and mark in line:
                at[name] = time.perf_counter() - t0
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0 or len(at) != len(marks):
        raise SystemExit(f"{' '.join(cmd)} failed (status {status}; saw {sorted(at)}):\n{''.join(lines[-5:])}")
    return {
        "to_first_step_s": at["first_step"],
        "to_layout_s": at["layout"],
        "opening_data_s": at["data_opened"] - at["layout"],
        "max_rss_mb": usage.ru_maxrss / 1024,
    }


def main() -> None:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=number(0, 1e9, lo_open=True), default=64)
    p.add_argument("--format", choices=("text", "chat"), default="text")
    p.add_argument("--chunk-mb", type=number(0, 1e9, lo_open=True), default=4)
    p.add_argument("--nodes", type=whole(1), nargs="+", default=[1, 2, 4])
    p.add_argument("--no-here", action="store_true", help="skip the single task outside Slurm")
    p.add_argument(
        "--small-mb", type=number(0, 1e9, lo_open=True), default=1, help="the corpus the start-up is compared with"
    )
    p.add_argument("--site", default="local")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    chunk = int(a.chunk_mb * 2**20)
    src = work / "corpus.jsonl"
    size = make_corpus(src, a.mb, a.format)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = []

    def record(where: str, tasks: list[dict], wall: float, out: Path, load_before: float, **extra) -> None:
        runs.append(
            {
                "where": where,
                **extra,
                "tasks": len(tasks),
                "wall_s": round(wall, 1),
                "slowest_task_s": max((t["wall_s"] for t in tasks), default=None),
                "task_cpu_s": [t["cpu_s"] for t in tasks],
                "task_wall_s": [t["wall_s"] for t in tasks],
                "load_before": load_before,
                "load_after": os.getloadavg()[0],
                "sha256": digest(out) if (out / PREPARED_MANIFEST).is_file() else None,
            }
        )
        print(json.dumps(runs[-1]), flush=True)

    if not a.no_here:
        load, t0 = os.getloadavg()[0], time.perf_counter()
        local = subprocess.run(
            [sys.executable, *prepare_cmd(src, work / "local-1", chunk, a.format)],
            cwd=work,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        record("here", task_times(local.stdout), time.perf_counter() - t0, work / "local-1", load)
    for nodes in a.nodes:
        name = f"prepare-bench-{nodes}n-{os.getpid()}"
        out = work / f"slurm-{nodes}"
        load, t0 = os.getloadavg()[0], time.perf_counter()
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hpc.submit",
                "--site",
                a.site,
                "--nodes",
                str(nodes),
                "--job-name",
                name,
                "--wait",
                "--",
                *prepare_cmd(src, out, chunk, a.format),
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        job_dir = work / "jobs" / run_dir_name(name)
        logs = "".join(f.read_text() for f in job_dir.glob(task_log(".", "*", "*").name)) if job_dir.is_dir() else ""
        record(f"{nodes} node(s)", task_times(logs), wall, out, load, rc=r.returncode)
    first = runs[0]
    base = first["slowest_task_s"] if first["where"] == "here" else sum(first["task_cpu_s"])
    prepared = work / ("local-1" if first["where"] == "here" else f"slurm-{a.nodes[0]}")
    small = work / "small.jsonl"
    make_corpus(small, a.small_mb, a.format)
    subprocess.run(
        [sys.executable, *prepare_cmd(small, work / "small", chunk, a.format)],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
    )
    manifest = json.loads((prepared / PREPARED_MANIFEST).read_text())
    result = {
        "bench": "prepare_bench",
        "date": datetime.date.today().isoformat(),
        "format": a.format,
        "corpus_bytes": size,
        "seq_len": SEQ,
        "chunk_bytes": chunk,
        "chunks": len(manifest["chunks"]),
        "totals": manifest["totals"],
        "runs": runs,
        "identical": len({r["sha256"] for r in runs}) == 1 and runs[0]["sha256"] is not None,
        "one_task_over_slowest_task": {r["where"]: base / r["slowest_task_s"] for r in runs if r.get("slowest_task_s")},
        "startup": {
            "corpus": startup(src, prepared, chunk, a.format, work / "run-corpus", env),
            f"{a.small_mb:g} MB": startup(small, work / "small", chunk, a.format, work / "run-small", env),
        },
    }
    text = json.dumps(result, indent=1)
    print(text)
    target = a.out or ROOT / "bench" / "results" / f"{result['date']}-prepare-local.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


if __name__ == "__main__":
    main()
