"""train.prepare at scale on the local cluster: one task here, then 1, 2 and 4 nodes (2 tasks each) through hpc.submit;
the outputs byte-identical; the trainer's start-up on the prepared data against a small corpus.

    python bench/prepare_bench.py [--mb 64] [--chunk-mb 4] [--nodes 1 2 4] [--site local] [--workdir DIR] [--out FILE]

The corpus is the demo corpus's paragraphs, repeated (each copy numbered) into JSONL documents of about 2 kB until it
holds ``--mb`` MB of text; format text packed by document at seq_len 1024, chunks of ``--chunk-mb`` MiB. Needs the local cluster
(source /tmp/hpc-slurm/env.sh). Prints JSON and writes it to bench/results/<date>-prepare-local.json (or --out).
Per run: the job's wall time (submission to end: Slurm start, imports, preparation) and the slowest task's own
preparation time; one_task_over_slowest_task compares the latter with the single task's. On a machine with fewer
cores than tasks the tasks run partly one after another, so that ratio is not the job's speed-up.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpc.node.contract import PREPARED_MANIFEST, task_log  # noqa: E402

SEQ = 1024


def make_corpus(path: Path, mb: float) -> int:
    from train.data.sources import DEMO_CORPUS

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


def task_seconds(log: str) -> list[float]:
    return [float(s) for s in re.findall(r"\[prepare\] task \d+/\d+: \d+ of \d+ chunks of .* in ([\d.]+)s", log)]


def digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.iterdir()):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def prepare_cmd(src: Path, out: Path, chunk: int) -> list[str]:
    return ["-m", "train.prepare", "--config", str(ROOT / "train/configs/tiny.yaml"), f"data.path={src}", f"data.prepared={out}",
            "data.pack=documents", f"seq_len={SEQ}", f"data.chunk_bytes={chunk}"]


def startup_s(src: Path, out: Path, chunk: int) -> float:
    """Seconds from nothing to the first micro-batch on prepared data: tokenizer, manifest check, memory maps, stream."""
    from train.data.config import DataConfig
    from train.data.prepared import open_prepared, split_rows
    from train.data.stream import PackedStream
    from train.tokenizer import load_tokenizer

    t0 = time.perf_counter()
    tok = load_tokenizer(None)
    data = open_prepared(DataConfig(path=str(src), pack="documents", chunk_bytes=chunk), SEQ, tok, "demo", out, 0, 1, "-", lambda m: None)
    stream = PackedStream(data, split_rows(data.num_rows, 0.0)[0], 8, 2, 0, 1, seed=0)
    stream.next_microbatches()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=64)
    p.add_argument("--chunk-mb", type=float, default=4)
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--site", default="local")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    chunk = int(a.chunk_mb * 2**20)
    src = work / "corpus.jsonl"
    size = make_corpus(src, a.mb)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = []
    t0 = time.perf_counter()
    local = subprocess.run([sys.executable, *prepare_cmd(src, work / "local-1", chunk)], cwd=work, env=env, check=True, capture_output=True, text=True)
    runs.append({"where": "here", "tasks": 1, "wall_s": time.perf_counter() - t0, "slowest_task_s": task_seconds(local.stdout)[0],
                 "sha256": digest(work / "local-1")})
    print(json.dumps(runs[-1]), flush=True)
    for nodes in a.nodes:
        name = f"prepare-bench-{nodes}n-{os.getpid()}"
        out = work / f"slurm-{nodes}"
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "hpc.submit", "--site", a.site, "--nodes", str(nodes), "--job-name", name, "--wait",
                            "--", *prepare_cmd(src, out, chunk)], cwd=work, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        logs = "".join(f.read_text() for f in (work / "jobs" / name).glob(task_log(".", "*", "*").name)) if (work / "jobs" / name).is_dir() else ""
        tasks = task_seconds(logs)
        runs.append({"where": f"{nodes} node(s)", "tasks": len(tasks), "rc": r.returncode, "wall_s": wall,
                     "slowest_task_s": max(tasks) if tasks else None, "sha256": digest(out) if (out / PREPARED_MANIFEST).is_file() else None})
        print(json.dumps(runs[-1]), flush=True)
    small = work / "small.jsonl"
    make_corpus(small, 1)
    subprocess.run([sys.executable, *prepare_cmd(small, work / "small", chunk)], cwd=work, env=env, check=True, capture_output=True)
    manifest = json.loads((work / "local-1" / PREPARED_MANIFEST).read_text())
    result = {
        "bench": "prepare_bench", "date": datetime.date.today().isoformat(), "corpus_bytes": size, "seq_len": SEQ, "chunk_bytes": chunk,
        "chunks": len(manifest["chunks"]), "totals": manifest["totals"], "runs": runs,
        "identical": len({r["sha256"] for r in runs}) == 1,
        "one_task_over_slowest_task": {r["where"]: runs[0]["slowest_task_s"] / r["slowest_task_s"]
                                for r in runs[1:] if r.get("slowest_task_s")},
        "startup_s": {"corpus": startup_s(src, work / "local-1", chunk), "1 MB": startup_s(small, work / "small", chunk)},
    }
    text = json.dumps(result, indent=1)
    print(text)
    target = a.out or ROOT / "bench" / "results" / f"{result['date']}-prepare-local.json"
    target.write_text(text + "\n")


if __name__ == "__main__":
    main()
