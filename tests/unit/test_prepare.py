"""train.prepare in process: a manifest that must match, corrupt shards refused, the prepared rows memory-mapped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from data_helpers import SEQ, cfg, long_prompt_chats

from hpc.node.cli import HpcError
from hpc.node.contract import PREPARED_MANIFEST as MANIFEST
from train.data.packing import IGNORE as IGNORE_LABEL
from train.data.prepared import PreparedData, describe, open_prepared, prepare, split_rows
from train.data.tokenizer import load_tokenizer
from train.front.data_config import DataConfig
from train.front.data_sources import DataError
from train.prepare import task_of


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

    def refused(match, data_cfg=None, seq=SEQ):
        data_cfg = cfg(src) if data_cfg is None else data_cfg
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


def test_of_tasks_finishing_together_one_publishes_the_manifest(tmp_path, source, tok):
    """A task that finds every chunk done and this key's manifest published leaves it alone and gets None; a corrupt
    manifest is replaced."""
    out = tmp_path / "p"
    first = prepare(cfg(source), SEQ, tok, "chat", out, log=lambda m: None)
    published = (out / MANIFEST).read_bytes()
    assert prepare(cfg(source), SEQ, tok, "chat", out, log=lambda m: None) is None
    assert (out / MANIFEST).read_bytes() == published and not list(out.glob(".*tmp"))
    (out / MANIFEST).write_text("{")
    assert prepare(cfg(source), SEQ, tok, "chat", out, log=lambda m: None) == first
    assert (out / MANIFEST).read_bytes() == published


def test_task_of_reads_torchrun_then_slurm():
    assert task_of({}) == (0, 1)
    assert task_of({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}) == (2, 4)
    assert task_of({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == (1, 2)
    with pytest.raises(HpcError, match=r"RANK=3 must be in \[0, WORLD_SIZE=2\)"):
        task_of({"RANK": "3", "WORLD_SIZE": "2"})


def test_text_documents_pack_whole_with_eos(tmp_path):
    """data.pack=documents in text mode: each document (and its EOS) whole in a row, every token after its first a
    target."""
    from train.data.packing import model_inputs

    tok = load_tokenizer(None)
    docs = [
        "To be, or not to be, that is the question.",
        "Now is the winter of our discontent.",
        "Exit, pursued by a bear.",
    ]
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
        for s, e in zip(starts, starts[1:], strict=False):
            text = tok.decode(x[row, s:e])
            if (y[row, s:e] != IGNORE_LABEL).any():  # not the padding
                found.add(text.removesuffix(tok.eos_token))
                assert y[row, s : e - 1].tolist() == x[row, s + 1 : e].tolist() and y[row, e - 1] == IGNORE_LABEL
    assert found == set(docs) and data.manifest["totals"]["rows"] == data.num_rows


@pytest.mark.parametrize("seq", [64, 128])
def test_data_whose_samples_all_lose_their_loss_tokens_is_refused(tmp_path, tok, seq):
    src = long_prompt_chats(tmp_path / "long.jsonl", 40)
    out = tmp_path / "p"
    with pytest.raises(DataError) as err:
        open_prepared(cfg(src), seq, tok, "chat", out, 0, 1, "-", log=lambda m: None)
    longest = max(len(sample.ids) for sample in chat_samples(tok, src))
    assert longest > seq
    assert str(err.value) == (
        f"data.overlong=truncate: 40 of 40 samples have no loss token within seq_len={seq} (the longest "
        f"sample has {longest} tokens), more than 50% or all; raise seq_len, or set "
        "data.overlong=truncate_left (keeps each sample's end: the last replies) or drop"
    )
    assert not (out / MANIFEST).exists()
    with pytest.raises(
        DataError, match=r"^data.overlong=truncate: 40 of 40 samples"
    ):  # the same line again, not a manifest
        open_prepared(cfg(src), seq, tok, "chat", out, 0, 1, "-", log=lambda m: None)


def chat_samples(tok, src: Path):
    from train.data.formats import ChatFormat
    from train.front.data_sources import Location

    records = [(Location(src, i), json.loads(line)) for i, line in enumerate(src.read_text().splitlines())]
    return list(ChatFormat(DataConfig(format="chat"), tok, "chat").samples(records))


def test_truncate_left_keeps_every_answer(tmp_path, tok):
    """overlong=truncate_left on the same data: every sample packed, its targets exactly its answer and <|im_end|>."""
    from train.data.packing import model_inputs

    src = long_prompt_chats(tmp_path / "long.jsonl", 40)
    data = open_prepared(
        cfg(src, overlong="truncate_left"), SEQ, tok, "chat", tmp_path / "p", 0, 1, "-", log=lambda m: None
    )
    t = data.manifest["totals"]
    assert (t["samples"], t["truncated"], t["no_loss"]) == (40, 40, 0)
    x, y, pos = model_inputs(*data.rows(np.arange(data.num_rows)))
    answers = []
    for row in range(len(x)):
        starts = [i for i in range(SEQ) if pos[row, i] == 0] + [SEQ]
        for s, e in zip(starts, starts[1:], strict=False):
            labels = y[row, s:e]
            if (labels != IGNORE_LABEL).any():
                answers.append(tok.decode(labels[labels != IGNORE_LABEL]))
    assert sorted(answers) == sorted(f"Hamlet {i}.<|im_end|>" for i in range(40))


def test_the_cli_refuses_data_that_truncation_leaves_without_loss_tokens_in_one_line(tmp_path, capsys):
    """The issue's case through train.prepare's command line: every conversation longer than seq_len with its answer
    at the end; overlong=truncate would train on nothing. One line naming seq_len, the longest sample and
    data.overlong, exit 2, no manifest."""
    import re

    from train_helpers import TINY

    from train.prepare import main

    src = long_prompt_chats(tmp_path / "long.jsonl", 40)
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--config",
                str(TINY),
                "data.format=chat",
                f"data.path={src}",
                "data.chunk_bytes=16384",
                f"seq_len={SEQ}",
                f"data.prepared={tmp_path / 'p'}",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().count("\n") == 0, err
    assert re.fullmatch(
        rf"train.prepare: error: data.overlong=truncate: 40 of 40 samples have no loss token within seq_len={SEQ} "
        r"\(the longest sample has \d+ tokens\), more than 50% or all; .*data.overlong=truncate_left.*\n",
        err,
    ), err
    assert not (tmp_path / "p" / MANIFEST).exists()
