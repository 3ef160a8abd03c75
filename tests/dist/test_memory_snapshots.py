"""Memory snapshots (checkpoint.memory_every) through the real `python -m train`: 4 ranks as 2 "nodes" x 2 (two
torchrun agents on this machine, each with its own SLURMD_NODENAME, one Slurm job id), dp2 x tp2 on CPU.

The first run snapshots every 3 steps and checkpoints to disk every 5; rank 2 freezes after step 13 (holding the GIL,
as in the fault catalogue), the test waits for the snapshot of step 12 to be complete, kills every process and
deletes the second node's directory (the node's memory lost with it). The next run of the same job resumes from the
snapshot of step 12, not the disk checkpoint of step 10, the second node's ranks receiving their states from the first
node (their partner copies), and every step's loss, grad norm and data position equal an uninterrupted run's (no
snapshots) bit for bit. At the clean end the job's snapshot directory is gone."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from train_helpers import REPEATABLE, ROOT, TINY, clean_env, free_port, kill_torchrun, metrics

from hpc.node.contract import SNAPSHOT_DIR_VAR, TEST_FAULTS_VAR

JOB = "4242"
COMMON = ("parallel.tp=2", "steps=16", "checkpoint.interval=5", "checkpoint.keep_last=3", "log.log_every=1")


def start(run_dir: Path, shm: Path, *overrides: str, **env: str) -> list[subprocess.Popen]:
    """Two torchrun agents as two nodes, node0 and node1 (2 ranks each), of Slurm job JOB."""
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        cmd += ["--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}"]
        cmd += ["-m", "train", "--config", str(TINY), f"log.dir={run_dir}", *COMMON, *overrides]
        extra = {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": f"node{node}", SNAPSHOT_DIR_VAR: str(shm), **env}
        log = (run_dir / f"node{node}.log").open("a")
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=clean_env(**extra), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    return procs


def finish(procs: list[subprocess.Popen], run_dir: Path, timeout: float = 240) -> str:
    for p in procs:
        assert p.wait(timeout=timeout) == 0, (run_dir / "node0.log").read_text()[-4000:]
    return (run_dir / "node0.log").read_text()


def complete_on_every_rank(job: Path, step: int) -> bool:
    name = f"step-{step:08d}"
    done = [p.name for node in ("node0", "node1") for p in (job / node / name).glob("done-rank-*")]
    return len(done) == 4


def test_a_lost_node_resumes_from_the_memory_snapshot_equal_to_an_uninterrupted_run(tmp_path):
    shm = tmp_path / "shm"
    job = shm / f"{JOB}.0"
    baseline = tmp_path / "baseline"
    finish(start(baseline, shm), baseline)

    run = tmp_path / "run"
    first = start(run, shm, "checkpoint.memory_every=3", **{TEST_FAULTS_VAR: "gil@2:13"})
    deadline = time.time() + 240
    while not (
        complete_on_every_rank(job, 12)
        and (run / "node1.log").exists()
        and "gil after step 13" in (run / "node1.log").read_text()
    ):
        assert time.time() < deadline and all(p.poll() is None for p in first), (run / "node0.log").read_text()[-3000:]
        time.sleep(0.1)
    for p in first:
        kill_torchrun(p)  # the frozen rank too
    assert (run / "checkpoints" / "step-00000010").is_dir() and not (run / "checkpoints" / "step-00000015").exists()
    held = sorted(p.name for p in (job / "node0" / "step-00000012").iterdir())
    assert held == ["done-rank-00000", "done-rank-00001", *(f"rank-0000{r}.pt" for r in range(4))], held
    assert not (job / "node0" / "step-00000009").exists()  # only the newest complete snapshot is kept
    shutil.rmtree(job / "node1")  # the second node's memory, lost with it

    out = finish(start(run, shm, "checkpoint.memory_every=3"), run)
    assert (
        "resumed from the memory snapshot of step 12 (newest disk checkpoint: step 10; 2 rank(s)' state sent by the "
        "nodes holding their partner copy (rank 2 from rank 0, rank 3 from rank 0))" in out
    ), out[-3000:]
    got, want = metrics(run), metrics(baseline)
    assert sorted(got) == sorted(want) == list(range(1, 17))
    for step in want:
        assert {k: got[step][k] for k in REPEATABLE} == {k: want[step][k] for k in REPEATABLE}, step
    assert not job.exists()  # removed at the run's clean end
