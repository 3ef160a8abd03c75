"""train.prepare: the same bytes for any number of tasks, a manifest that must match, corrupt shards refused,
the prepared rows memory-mapped; once through hpc.submit on the local cluster."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpc.node.cli import HpcError
from train.data.config import DataConfig
from train.data.packing import IGNORE as IGNORE_LABEL
from train.data.prepared import PreparedData, describe, open_prepared, prepare, split_rows
from train.data.sources import DEMO_CHAT, DataError
from train.prepare import task_of
from train.tokenizer import DEMO_CHAT_TOKENIZER_DIR, load_tokenizer
from train_helpers import ROOT, TINY, clean_env

SEQ = 64
LINES = 600  # about 150 kB: 10 chunks of 16 kB


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(DEMO_CHAT_TOKENIZER_DIR))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("src") / "chat.jsonl"
    with DEMO_CHAT.open() as f:
        path.write_text("".join(next(f) for _ in range(LINES)))
    return path


def cfg(path: Path, **kw) -> DataConfig:
    return DataConfig(format="chat", path=str(path), chunk_bytes=16384, **kw)


def tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def cli(out: Path, source: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    args = [sys.executable, "-m", "train.prepare", "--config", str(TINY), "data.format=chat", f"data.path={source}",
            "data.chunk_bytes=16384", f"seq_len={SEQ}", f"data.prepared={out}", *extra]
    return subprocess.Popen(args, cwd=ROOT, env=clean_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_one_task_and_three_concurrent_tasks_write_the_same_bytes(tmp_path, source, tok):
    one = tmp_path / "one"
    manifest = prepare(cfg(source), SEQ, tok, "chat", one, 0, 1, log=lambda m: None)
    n = -(-source.stat().st_size // 16384)
    assert n >= 6 and len(manifest["chunks"]) == n and manifest["totals"]["samples"] == LINES
    three = tmp_path / "three"
    procs = [cli(three, source, env={"SLURM_PROCID": str(r), "SLURM_NTASKS": "3"}) for r in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert sum("done in" in o for o, _ in outs) == 1  # the task that finished last wrote the manifest
    assert sorted(int(re.search(rf"task \d/3: (\d+) of {n} chunks", o).group(1)) for o, _ in outs) == sorted(len(range(r, n, 3)) for r in range(3))
    assert tree(one) == tree(three)
    t = manifest["totals"]
    print(f"prepared {LINES} conversations: {t['rows']} rows of {SEQ}, packing efficiency {100 * t['packing_efficiency']:.1f}%, "
          f"1 task and 3 tasks byte-identical ({len(tree(one))} files)")


def test_prepared_rows_are_memory_mapped_and_split_deterministically(tmp_path, source, tok):
    out = tmp_path / "p"
    prepare(cfg(source), SEQ, tok, "chat", out, log=lambda m: None)
    data = PreparedData(out, describe(cfg(source), SEQ, tok), "prepare it")
    assert all(isinstance(t, np.memmap) for t in data.tokens)
    ids = np.array([0, data.num_rows - 1, 5])
    tokens, flags = data.rows(ids)
    assert tokens.shape == flags.shape == (3, SEQ)
    whole = np.concatenate([np.asarray(t) for t in data.tokens])
    assert np.array_equal(tokens, whole[ids])
    train, held = split_rows(data.num_rows, 0.1)
    assert len(np.intersect1d(train, held)) == 0 and len(train) + len(held) == data.num_rows
    assert 0.05 < len(held) / data.num_rows < 0.15 and np.array_equal(split_rows(data.num_rows, 0.1)[1], held)


def test_mismatched_or_corrupt_prepared_data_is_refused_in_one_line(tmp_path, source, tok):
    src = tmp_path / "chat.jsonl"
    src.write_bytes(source.read_bytes())
    out = tmp_path / "p"
    prepare(cfg(src), SEQ, tok, "chat", out, log=lambda m: None)

    def refused(match, data_cfg=cfg(src), seq=SEQ):
        with pytest.raises(DataError, match=match) as err:
            open_prepared(data_cfg, seq, tok, "chat", out, 0, 1, "python -m train.prepare ...", log=lambda m: None)
        assert "\n" not in str(err.value)

    refused(r"prepared with another seq_len \(was 64, now 32\)", seq=32)
    refused(r"prepared with another enable_thinking", cfg(src, enable_thinking=True))
    with src.open("a") as f:
        f.write(src.read_text().splitlines()[0] + "\n")
    refused(r"prepared with another sources \(a source file was added, removed or changed since\)")
    prepare(cfg(src), SEQ, tok, "chat", out, log=lambda m: None)  # prepared again: opens
    open_prepared(cfg(src), SEQ, tok, "chat", out, 0, 1, "-", log=lambda m: None)
    shard = out / "chunk-00002.tokens.npy"
    shard.write_bytes(shard.read_bytes()[:-100])
    refused(r"data.prepared: .*chunk-00002.*(missing or corrupt|the manifest says)")


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 7}]}) + "\n")
    out, err = (proc := cli(tmp_path / "p", bad)).communicate(timeout=120)
    assert proc.returncode == 2 and err.strip().count("\n") == 0
    assert err.startswith(f"train.prepare: error: data.messages_field (messages): {bad}:1 turn 1 (assistant) has content of type int")
    proc = subprocess.run([sys.executable, "-m", "train.prepare", "--config", str(TINY)], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "data.pack=stream" in proc.stderr and proc.stderr.count("\n") == 1


def test_task_of_reads_torchrun_then_slurm():
    assert task_of({}) == (0, 1)
    assert task_of({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}) == (2, 4)
    assert task_of({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == (1, 2)
    with pytest.raises(HpcError, match=r"RANK=3 must be in \[0, WORLD_SIZE=2\)"):
        task_of({"RANK": "3", "WORLD_SIZE": "2"})


@pytest.mark.slurm
def test_prepare_through_hpc_submit_on_two_nodes_matches_one_task(slurm, tmp_path, source, tok):
    from conftest import run_cli

    out = tmp_path / "slurm"
    r = run_cli("-m", "hpc.submit", "--site", "local", "--nodes", "2", "--job-name", "chat-prepare", "--wait", "--",
                "-m", "train.prepare", "--config", str(TINY), "data.format=chat", f"data.path={source}", "data.chunk_bytes=16384",
                f"seq_len={SEQ}", f"data.prepared={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "jobs" / "chat-prepare").glob("*_log.out"))
    tasks = set(re.findall(r"\[prepare\] task (\d)/(\d)", logs))
    assert len(tasks) == 4 and {w for _, w in tasks} == {"4"}, logs[-3000:]
    one = tmp_path / "one"
    prepare(cfg(source), SEQ, tok, "chat", one, log=lambda m: None)
    assert tree(out) == tree(one)


def test_text_documents_pack_whole_with_eos(tmp_path):
    """data.pack=documents in text mode: each document (and its EOS) whole in a row, every token after its first a target."""
    from train.data.packing import model_inputs

    tok = load_tokenizer(None)
    docs = ["To be, or not to be, that is the question.", "Now is the winter of our discontent.", "Exit, pursued by a bear."]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    data_cfg = DataConfig(path=str(src), pack="documents")
    prepare(data_cfg, 32, tok, "demo", tmp_path / "p", log=lambda m: None)
    data = PreparedData(tmp_path / "p", describe(data_cfg, 32, tok), "-")
    tokens, flags = data.rows(np.arange(data.num_rows))
    x, y, pos = model_inputs(tokens, flags)
    found = set()
    for row in range(len(x)):
        starts = [i for i in range(32) if pos[row, i] == 0] + [32]
        for s, e in zip(starts, starts[1:]):
            text = tok.decode(x[row, s:e])
            if (y[row, s:e] != IGNORE_LABEL).any():  # not the padding
                found.add(text.removesuffix(tok.eos_token))
                assert y[row, s:e - 1].tolist() == x[row, s + 1:e].tolist() and y[row, e - 1] == IGNORE_LABEL
    assert found == set(docs) and data.manifest["totals"]["rows"] == data.num_rows
