"""Straggler naming through the real trainer under torchrun (gloo on CPU): a rank made slow by the test-only setting
is named with its node within three windows, and nobody else; a clean run names nobody, for under 1% overhead."""

import re
import socket
import subprocess
import sys

from train_helpers import ROOT, clean_env, finish, launch, metrics, train_cmd

WINDOW = ["straggler.every=5", "straggler.windows=3", "checkpoint.interval=0"]


def test_the_slow_rank_is_named_with_its_node(tmp_path):
    run = tmp_path / "slow"
    out = finish(launch(3, run, "steps=15", "global_batch=6", *WINDOW, "straggler.test_slow_rank=2", "straggler.test_slow_s=0.05"), run)
    node = socket.gethostname()
    lines = [l for l in out.splitlines() if l.startswith("[straggler]")]
    assert len(lines) == 1, out[-3000:]
    assert re.fullmatch(rf"\[straggler\] step 15: rank 2 on {re.escape(node)}, \d+% slower than the median over 3 windows "
                        r"\(compute [\d.]+ s per step, others' median [\d.]+ s\)", lines[0]), lines[0]
    records = metrics(run)
    named = records[15]["stragglers"]
    assert [(f["rank"], f["node"], f["windows"]) for f in named] == [(2, node, 3)]
    assert named[0]["compute_s"] > named[0]["others_median_s"] + 0.04  # the 0.05 s of extra compute, measured
    assert all("stragglers" not in records[s] for s in range(1, 15))


def test_a_clean_run_names_nobody(tmp_path):
    run = tmp_path / "clean"
    # 30%, as on the local cluster: two ranks sharing two cores with the rest of the suite differ by more than 10%
    out = finish(launch(2, run, "steps=20", *WINDOW, "straggler.threshold=0.3"), run)
    records = metrics(run)
    assert "[straggler]" not in out and not any("stragglers" in r for r in records.values())
    overhead = records[20]["straggler_overhead_s"]
    total = sum(r["step_time_s"] for r in records.values())
    print(f"\n[straggler] overhead {overhead * 1e3:.2f} ms of {total:.2f} s of steps ({100 * overhead / total:.3f}%)")
    assert 0 < overhead < 0.01 * total


def test_a_persistent_straggler_stops_the_run_and_marks_its_node(tmp_path):
    """straggler.stop_after: the slow rank's node is marked bad and every rank stops after the same step with a
    checkpoint (each rank through hpc.node.launch --rank, as on a node: the clean stop becomes exit 0 + stop record)."""
    run, marks, record = tmp_path / "run", tmp_path / "marks", tmp_path / "stop-record"
    run.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--no-python",
           sys.executable, "-m", "hpc.node.launch", "--rank", "--", *train_cmd(1, f"log.dir={run}", "steps=30", *WINDOW,
           "straggler.windows=2", "straggler.stop_after=2", "straggler.test_slow_rank=1", "straggler.test_slow_s=0.05")]
    with (run / "launch.log").open("w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=clean_env(HPC_BAD_NODE_MARKS=str(marks), HPC_STOP_RECORD=str(record)),
                            stdout=log, stderr=subprocess.STDOUT, timeout=300).returncode
    out = (run / "launch.log").read_text()
    assert rc == 0, out[-3000:]
    node = socket.gethostname()
    assert re.search(rf"\[preempt\] stopped at step 10 of 30 after a persistent straggler \(rank 1 on {re.escape(node)}, "
                     r"\d+% slower than the median over 2 windows\), checkpoint saved", out), out[-3000:]
    assert sorted(p.name for p in marks.iterdir()) == [node]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")) == ["step-00000010"]
    assert "stopped cleanly" in record.read_text()
    assert max(metrics(run)) == 10
