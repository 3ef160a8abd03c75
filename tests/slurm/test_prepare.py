"""train.prepare through hpc.submit on the local cluster: 4 tasks on 2 nodes write the bytes of one."""

from __future__ import annotations

import re

from conftest import run_cli
from data_helpers import SEQ, cfg, tree
from train_helpers import TINY

from train.data.prepared import prepare


def test_prepare_through_hpc_submit_on_two_nodes_matches_one_task(slurm, tmp_path, source, tok):
    out = tmp_path / "slurm"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        "chat-prepare",
        "--wait",
        "--",
        "-m",
        "train.prepare",
        "--config",
        str(TINY),
        "data.format=chat",
        f"data.path={source}",
        "data.chunk_bytes=16384",
        f"seq_len={SEQ}",
        f"data.prepared={out}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "jobs" / "chat-prepare").glob("*_log.out"))
    tasks = set(re.findall(r"\[prepare\] task (\d)/(\d)", logs))
    assert len(tasks) == 4 and {w for _, w in tasks} == {"4"}, logs[-3000:]
    one = tmp_path / "one"
    prepare(cfg(source), SEQ, tok, "chat", one, log=lambda m: None)
    assert tree(out) == tree(one)
