"""train.prepare as processes: three concurrent tasks write the bytes of one; bad input is one line, exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from data_helpers import LINES, SEQ, cfg, tree
from train_helpers import ROOT, TINY, clean_env

from train.data.prepared import prepare


def cli(out: Path, source: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "train.prepare",
        "--config",
        str(TINY),
        "data.format=chat",
        f"data.path={source}",
        "data.chunk_bytes=16384",
        f"seq_len={SEQ}",
        f"data.prepared={out}",
        *extra,
    ]
    return subprocess.Popen(
        args, cwd=ROOT, env=clean_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_one_task_and_three_concurrent_tasks_write_the_same_bytes(tmp_path, source, tok):
    one = tmp_path / "one"
    manifest = prepare(cfg(source), SEQ, tok, "chat", one, 0, 1, log=lambda m: None)
    n = -(-source.stat().st_size // 16384)
    assert (
        n >= 6
        and len(manifest["chunks"]) == n
        and manifest["totals"]["samples"] + manifest["totals"]["no_loss"] == LINES
    )
    three = tmp_path / "three"
    procs = [cli(three, source, env={"SLURM_PROCID": str(r), "SLURM_NTASKS": "3"}) for r in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert sum("done in" in o for o, _ in outs) == 1  # the task that finished last wrote the manifest
    assert sorted(int(re.search(rf"task \d/3: (\d+) of {n} chunks", o).group(1)) for o, _ in outs) == sorted(
        len(range(r, n, 3)) for r in range(3)
    )
    assert tree(one) == tree(three)
    t = manifest["totals"]
    print(
        f"prepared {LINES} conversations: {t['rows']} rows of {SEQ}, "
        f"packing efficiency {100 * t['packing_efficiency']:.1f}%, "
        f"1 task and 3 tasks byte-identical ({len(tree(one))} files)"
    )


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 7}]}) + "\n"
    )
    out, err = (proc := cli(tmp_path / "p", bad)).communicate(timeout=120)
    assert proc.returncode == 2 and err.strip().count("\n") == 0
    assert err.startswith(
        f"train.prepare: error: data.messages_field (messages): {bad}:1 turn 1 (assistant) has content of type int"
    )
