"""hpc.node.restart at SIGTERM (the job cancelled or requeued): it passes the signal to the ranks' srun, which ends
cleanly, and exits with the requeue code (75) well within Slurm's KillWait (30 s by default). The srun is a stand-in
on PATH that records its arguments and the signal it got."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpc.node.contract import EXIT_STOPPED

FAKE_SRUN = """#!/bin/bash
trap 'kill $!; echo TERM > "$HPC_JOB_DIR/srun-got"; exit 143' TERM
echo "$@" >> "$HPC_JOB_DIR/srun-started"
sleep 60 >/dev/null & wait
"""


def test_sigterm_stops_the_ranks_and_exits_75(tmp_path: Path):
    bin_dir, jobs = tmp_path / "bin", tmp_path / "jobs"
    bin_dir.mkdir()
    jobs.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_"))},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "HPC_JOB_DIR": str(jobs),
        "HPC_STOP_RECORD": str(jobs / "stop"),
    }
    argv = [sys.executable, "-m", "hpc.node.restart", "--nodes", "2", "--tasks-per-node", "1", "--ranks", "2"]
    proc = subprocess.Popen(
        [*argv, "--marks", str(jobs / "marks"), "--", "srun", "true"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        started = jobs / "srun-started"  # the ranks' srun and the batch host's watch, in either order
        while not (started.exists() and "--nodelist=n1,n2 " in started.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks' srun was not started"
            time.sleep(0.05)
        time.sleep(0.3)  # srun's trap is set
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=25)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    out = proc.stdout.read()
    assert rc == EXIT_STOPPED, out
    assert took < 10, f"{took:.1f} s after SIGTERM"
    assert (jobs / "srun-got").read_text().strip() == "TERM"
    assert "got SIGTERM" in out
    assert (jobs / "marks").is_dir()
