"""Who is missing at a hang, through the real trainer under torchrun (gloo on CPU): one rank stops itself (SIGSTOP,
the test-only straggler.test_stop_rank); the others time out, name it with its node, and the run fails promptly. And
when the rendezvous store's host is the one stopped, the arrival is given up within the store's timeout."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from train_helpers import ROOT, clean_env, free_port, kill_torchrun, launch

from hpc.node.hang import post_arrival

TIMEOUT_S = 10


def still_stopped(pid: int) -> bool:
    """Whether process ``pid`` exists and is stopped (state T)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_a_stopped_rank_is_named_and_the_run_ends(tmp_path, monkeypatch):
    run = tmp_path / "hang"
    monkeypatch.setenv("HPC_DIST_TIMEOUT_S", str(TIMEOUT_S))
    proc = launch(
        3,
        run,
        "steps=20",
        "global_batch=6",
        "checkpoint.interval=0",
        "straggler.test_stop_rank=2",
        "straggler.test_stop_step=3",
    )
    stopped, t_stop, t_named = None, None, None
    log = run / "launch.log"
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            text = log.read_text()
            found = re.search(r"\(pid (\d+)\): straggler.test_stop_rank: stopping myself", text)
            if t_stop is None and found:
                t_stop, stopped = time.monotonic(), int(found.group(1))
            if t_named is None and "did not arrive" in text:
                t_named = time.monotonic()
            time.sleep(0.2)
        rc = proc.wait(timeout=5)
        t_end = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
        leaked = stopped is not None and still_stopped(stopped)
        if leaked:  # nothing left behind: the stopped rank is killed here if the launcher has not
            os.kill(stopped, signal.SIGKILL)
    out = log.read_text()
    assert t_stop is not None, out[-3000:]
    assert not leaked, "torchrun left the stopped rank behind"
    node = re.escape(socket.gethostname())
    lines = [line for line in out.splitlines() if "did not arrive" in line]
    assert len(lines) == 1, out[-3000:]
    assert re.fullmatch(
        rf"\[hang\] a collective timed out after step 3 \(after \d+ s\): rank 2 on {node} did not arrive "
        r"\(ranks 0, 1 did\)",
        lines[0],
    ), lines[0]
    assert rc != 0
    assert t_end - t_stop < TIMEOUT_S + 60, out[-3000:]
    events = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r.get("event") == "hang"]
    assert events == [
        {
            "step": 3,
            "event": "hang",
            "elapsed_s": events[0]["elapsed_s"],
            "missing": [{"rank": 2, "node": socket.gethostname()}],
            "arrived": [0, 1],
            "peer_ended": False,
        }
    ]
    print(
        f"\n[hang] fault -> named line {t_named - t_stop:.1f} s, fault -> run ended {t_end - t_stop:.1f} s "
        f"(HPC_DIST_TIMEOUT_S={TIMEOUT_S})"
    )


def test_a_stopped_store_host_is_noticed_within_the_store_timeout():
    port = free_port()
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, datetime, torch.distributed as d; "
            f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False); "
            "print('up', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout.readline().strip() == "up"
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        os.kill(host.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        assert post_arrival(client, 1, 2, grace_s=5.0, store_timeout_s=1.0) is None
        assert time.monotonic() - t0 < 5.0 + 1.0 + 1.0  # the grace and the store's timeout, at most
    finally:
        host.kill()
        host.wait()


def pair_says(script: str, *args: str) -> tuple[str, str]:
    """Run tests/scripts/SCRIPT as a pair of gloo ranks under torchrun until a rank prints its ``[NAME]`` line (NAME:
    the script's stem); that line (empty if none) and the output so far. Every process is killed after."""
    tag = f"[{Path(script).stem}]"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(ROOT / "tests" / "scripts" / script), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = ""
    try:
        for line in proc.stdout:
            out += line
            if line.startswith(tag):
                return line.strip(), out
        return "", out
    finally:
        kill_torchrun(proc)  # a stopped rank too


@pytest.mark.parametrize("mode, kind", [("ended", "peer ended"), ("stopped", "timeout")])
def test_gloo_s_errors_tell_a_peer_that_ended_from_one_that_timed_out(mode, kind):
    """Only a timeout marks a node bad: a peer whose process ended (its host closed the connections) is named, but its
    node answered. gloo's own errors, from a real pair of ranks."""
    line, out = pair_says("collective_failure.py", mode, "3")
    assert line.startswith(f"[collective_failure] {kind}: "), out[-3000:]


def test_a_peer_lost_in_the_middle_of_a_save_is_a_collective_failure_not_a_save_error(tmp_path):
    """A node lost while a checkpoint is written: the survivor's save raises the collective's own error (for the
    hang report that names the missing rank), not the CheckpointError of a failed save (exit 1, the program's)."""
    line, out = pair_says("save_peer_lost.py", str(tmp_path), "10")
    assert line.startswith("[save_peer_lost] peer ended: RuntimeError: "), out[-3000:]
