"""Straggler naming through the real trainer under torchrun (gloo on CPU): a rank made slow by the test-only setting
is named with its node within three windows, and nobody else, its computation the cause; a rank stopped and continued
from outside half of the time is named too, its computation not the cause; a clean run names nobody, for under 1%
overhead."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from train_helpers import ROOT, clean_env, finish, launch, metrics, train_cmd

WINDOW = ["straggler.every=5", "straggler.windows=3", "checkpoint.interval=0"]


def test_the_slow_rank_is_named_with_its_node(tmp_path):
    run = tmp_path / "slow"
    # 50%: three ranks on two shared cores are descheduled at random, and a rank descheduled is one the others wait for
    out = finish(
        launch(
            3,
            run,
            "steps=15",
            "global_batch=6",
            *WINDOW,
            "straggler.threshold=0.5",
            "straggler.test_slow_rank=2",
            "straggler.test_slow_s=0.05",
        ),
        run,
    )
    node = socket.gethostname()
    lines = [line for line in out.splitlines() if line.startswith("[straggler]")]
    assert len(lines) == 1, out[-3000:]
    assert re.fullmatch(
        rf"\[straggler\] step 15: rank 2 on {re.escape(node)}, \d+% slower than the median over 3 windows: "
        r"its computation is slower \(busy [\d.]+ s per step, others' median [\d.]+ s; compute [\d.]+ s, "
        r"others' median [\d.]+ s\)",
        lines[0],
    ), lines[0]
    records = metrics(run)
    named = records[15]["stragglers"]
    assert [(f["rank"], f["node"], f["windows"], f["cause"]) for f in named] == [(2, node, 3, "compute")]
    assert named[0]["compute_s"] > named[0]["others_compute_s"] + 0.04  # the 0.05 s of extra compute, measured
    # and it is the busiest: the others' busy time takes in whatever descheduling two shared cores give them, so by how
    # much is the load's, not the trainer's, to say
    assert named[0]["busy_s"] > named[0]["others_busy_s"]
    assert all("stragglers" not in records[s] for s in range(1, 15))


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of torchrun's child process ``parent`` that runs rank ``rank`` (from /proc)."""
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
                and f"RANK={rank}\0".encode() in b"\0" + (entry / "environ").read_bytes()
            ):
                return int(entry.name)
        except OSError:
            continue
    return None


def test_a_rank_stopped_from_outside_is_named_as_the_one_the_others_wait_for(tmp_path):
    """Another process stops and continues rank 2 (SIGSTOP 0.2 s, SIGCONT 0.2 s), as a user's node saw it: its thread
    time per step is unchanged, so only the others' waiting names it."""
    run = tmp_path / "stalled"
    proc = launch(3, run, "steps=60", "global_batch=6", *WINDOW, "straggler.threshold=0.5")
    pid, stops = None, 0
    try:
        while proc.poll() is None:
            pid = pid or rank_pid(proc.pid, 2)
            if pid is None or not (run / "metrics.jsonl").exists():
                time.sleep(0.05)
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.2)
                os.kill(pid, signal.SIGCONT)
                stops += 1
            except ProcessLookupError:
                break
            time.sleep(0.2)
    finally:
        if pid:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    out = finish(proc, run)
    node = socket.gethostname()
    records = metrics(run)
    named = [(s, f) for s, r in sorted(records.items()) for f in r.get("stragglers", [])]
    print(
        f"\n[straggler] rank 2 stopped {stops} times for 0.2 s: named at steps {[s for s, _ in named]}; "
        + "; ".join(
            f"busy {f['busy_s']:.3f} s vs {f['others_busy_s']:.3f} s, compute {f['compute_s']:.3f} s vs "
            f"{f['others_compute_s']:.3f} s"
            for _, f in named[:1]
        )
    )
    assert named and {(f["rank"], f["node"], f["cause"]) for _, f in named} == {(2, node, "host")}, out[-3000:]
    assert re.search(
        rf"\[straggler\] step \d+: rank 2 on {re.escape(node)}, \d+% slower than the median over 3 windows: the "
        r"others wait for it, its computation is not slower",
        out,
    )


def test_a_clean_run_names_nobody(tmp_path):
    run = tmp_path / "clean"
    # 100%, as on the local cluster: two ranks sharing two cores with the rest of the suite are descheduled at random,
    # and in a window of 10 steps one is often the one the other waits for; windows of 10 steps, not 5, so that one
    # exchange descheduled on these shared cores is not 1% of the steps' time
    out = finish(launch(2, run, "steps=40", *WINDOW, "straggler.every=10", "straggler.threshold=1.0"), run)
    records = metrics(run)
    assert "[straggler]" not in out and not any("stragglers" in r for r in records.values())
    overhead = records[40]["straggler_overhead_s"]
    total = sum(r["step_time_s"] for r in records.values())
    print(f"\n[straggler] overhead {overhead * 1e3:.2f} ms of {total:.2f} s of steps ({100 * overhead / total:.3f}%)")
    assert 0 < overhead < 0.01 * total


def test_a_persistent_straggler_stops_the_run_and_marks_its_node(tmp_path):
    """straggler.stop_after: the slow rank's node is marked bad and every rank stops after the same step with a
    checkpoint (each rank through hpc.node.launch --rank, as on a node: the clean stop becomes exit 0 + stop record)."""
    run, marks, record = tmp_path / "run", tmp_path / "marks", tmp_path / "stop-record"
    run.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--no-python",
        sys.executable,
        "-m",
        "hpc.node.launch",
        "--rank",
        "--",
        *train_cmd(
            1,
            f"log.dir={run}",
            "steps=30",
            *WINDOW,
            "straggler.windows=2",
            "straggler.stop_after=2",
            "straggler.test_slow_rank=1",
            "straggler.test_slow_s=0.05",
        ),
    ]
    with (run / "launch.log").open("w") as log:
        rc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=clean_env(HPC_BAD_NODE_MARKS=str(marks), HPC_STOP_RECORD=str(record)),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
        ).returncode
    out = (run / "launch.log").read_text()
    assert rc == 0, out[-3000:]
    node = socket.gethostname()
    assert re.search(
        rf"\[preempt\] stopped at step 10 of 30 after a persistent straggler \(rank 1 on {re.escape(node)}, "
        r"\d+% slower than the median over 2 windows: its computation is slower\), checkpoint saved",
        out,
    ), out[-3000:]
    assert sorted(p.name for p in marks.iterdir()) == [node]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")) == ["step-00000010"]
    assert "stopped cleanly" in record.read_text()
    assert max(metrics(run)) == 10
