"""Chat fine-tuning end to end through `python -m train`: the loss is the mean over the global batch's loss tokens,
so the same data gives the same loss under one process, dp2 x tp2 and any gradient accumulation; the held-out
evaluation changes neither the training nor a resumed run; bad chat data is one line and exit 2 on every rank."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from train_helpers import ROOT, clean_env, finish, launch, metrics, seed_checkpoint, train_cmd

STEPS = 4
CHAT = (
    "data.format=chat",
    "seq_len=64",
    "global_batch=8",
    f"steps={STEPS}",
    "log.log_every=1",
    "schedule.warmup_steps=0",
    "optim.lr=3e-3",
    "eval.fraction=0.1",
)
EVAL = ("eval.every=2", "eval.batches=2")
TOL = 1e-5


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "train.prepare", "--config", "train/configs/tiny.yaml", *CHAT, f"data.prepared={out}"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prepared):
    base = tmp_path_factory.mktemp("chat")
    layouts = {
        "one": (1, "micro_batch=8", "checkpoint.interval=2", "checkpoint.keep_last=5", *EVAL),
        "accum8": (1, "micro_batch=1", "checkpoint.interval=0", *EVAL),
        "dp2xtp2": (4, "micro_batch=2", "parallel.tp=2", "checkpoint.interval=0", *EVAL),
        "no_eval": (1, "micro_batch=8", "checkpoint.interval=0"),
    }
    procs = {
        name: launch(n, base / name, *CHAT, *rest, f"data.prepared={prepared}") for name, (n, *rest) in layouts.items()
    }
    out = {name: finish(proc, base / name) for name, proc in procs.items()}
    seed_checkpoint(base / "one", 2, base / "resumed")
    out["resumed"] = finish(
        launch(1, base / "resumed", *CHAT, *layouts["one"][1:], f"data.prepared={prepared}"), base / "resumed"
    )
    return {name: metrics(base / name) for name in out} | {"out": out}


def test_same_loss_under_any_layout_and_accumulation(runs):
    one = runs["one"]
    assert sorted(one) == list(range(1, STEPS + 1))
    for name in ("accum8", "dp2xtp2"):
        other = runs[name]
        assert [other[s]["loss_tokens"] for s in one] == [one[s]["loss_tokens"] for s in one]
        loss = max(abs(other[s][key] - one[s][key]) for s in one for key in ("loss", "eval_loss") if key in one[s])
        gnorm = max(abs(other[s]["grad_norm"] - one[s]["grad_norm"]) / one[s]["grad_norm"] for s in one)
        print(f"{name} vs one process, micro_batch 8: max |loss diff| {loss:.2e}, max rel grad-norm diff {gnorm:.2e}")
        assert loss < TOL and gnorm < TOL
    assert len({one[s]["loss_tokens"] for s in one}) > 1  # steps count different numbers of tokens: a real test
    assert one[STEPS]["loss"] < one[1]["loss"]


def test_evaluation_changes_neither_training_nor_a_resumed_run(runs):
    one, no_eval, resumed = runs["one"], runs["no_eval"], runs["resumed"]
    assert [s for s in one if "eval_loss" in one[s]] == [2, 4] and not any("eval_loss" in r for r in no_eval.values())
    assert [one[s]["loss"] for s in one] == [no_eval[s]["loss"] for s in one]  # bitwise
    assert sorted(resumed) == [3, 4]
    assert [(resumed[s]["loss"], resumed[s].get("eval_loss")) for s in resumed] == [
        (one[s]["loss"], one[s].get("eval_loss")) for s in resumed
    ]
    assert one[4]["eval_loss"] < one[2]["eval_loss"]


def test_progress_reports_packing_and_eval(runs):
    out = runs["out"]["dp2xtp2"]
    assert "[data] prepared" in out and "packing efficiency" in out and "layout dp=2 x tp=2" in out
    assert "held-out rows every 2 steps" in out and re.search(r"step 4/4 \| loss [\d.]+ \| eval [\d.]+ \|", out)


def test_bad_chat_data_is_one_line_and_exit_2_on_every_rank(tmp_path):
    data = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    data.write_text(
        json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + "\n"
    )
    run = tmp_path / "run"
    proc = subprocess.run(
        train_cmd(2, *CHAT, "micro_batch=1", f"data.path={data}", f"log.dir={run}"),
        cwd=ROOT,
        env=clean_env(HPC_DIST_TIMEOUT_S="20"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train: error:")]
    assert proc.returncode != 0 and "Timed out" not in proc.stderr
    assert len(errors) == 2 and all(f"{data}:2 has no assistant turn" in e for e in errors), proc.stderr[-3000:]
    single = subprocess.run(
        train_cmd(1, *CHAT, "micro_batch=1", f"data.path={data}", f"log.dir={tmp_path / 'one'}"),
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert single.returncode == 2 and single.stderr.strip().splitlines()[-1].startswith(
        "train: error: data.messages_field"
    )


@pytest.mark.parametrize("pack", ["documents", "stream"])
def test_unprepared_data_is_prepared_by_the_job_without_waiting_at_a_collective(tmp_path, pack):
    """Rank 0 tokenizes a 17 MB corpus (one chunk: all its work) far longer than the 4 s collective timeout; rank 1
    polls for the manifest (or the token cache) instead of waiting at a barrier, and the job trains."""
    from train.front.data_sources import DEMO_CORPUS

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        DEMO_CORPUS.read_text() * 8
    )  # one chunk (below) whose tokenizing outlasts the timeout on a quiet machine too
    run = tmp_path / "run"
    proc = subprocess.run(
        train_cmd(
            2,
            f"data.pack={pack}",
            f"data.path={corpus}",
            f"data.chunk_bytes={2**26}",
            "steps=2",
            "schedule.warmup_steps=0",
            "checkpoint.interval=0",
            f"log.dir={run}",
        ),
        cwd=ROOT,
        env=clean_env(HPC_DIST_TIMEOUT_S="4"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted(metrics(run)) == [1, 2]
    if pack == "documents":
        took = float(re.search(r"\[prepare\] task 0/2: 1 of 1 chunks of .* in ([\d.]+)s", proc.stdout).group(1))
        print(f"rank 0 prepared for {took:.1f}s while rank 1 polled; collective timeout 4 s")
        assert took > 4


@pytest.mark.parametrize(
    "override,message",
    [
        ("data.tokenizer=train/assets/tokenizer", "data.tokenizer: train/assets/tokenizer has no chat template"),
        ("seq_len=32", "was prepared with another seq_len (was 64, now 32); run python -m train.prepare"),
    ],
)
def test_no_chat_template_or_stale_prepared_data_is_one_line_exit_2(prepared, tmp_path, override, message):
    proc = subprocess.run(
        train_cmd(1, *CHAT, "micro_batch=8", f"data.prepared={prepared}", f"log.dir={tmp_path}", override),
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if not line.startswith(("W1", "Failed to load"))]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
