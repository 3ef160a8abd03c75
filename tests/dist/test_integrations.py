"""Users' own scripts under the stop-and-requeue contract (hpc.integrations): a TRL SFTTrainer script with
RequeueCallback and an accelerate loop with Requeue, on 1 process and on 2 (torchrun, gloo, DDP), each under
hpc.node.launch --rank as the torchrun and accelerate launchers run them. At a notice after some step every rank
stops after the same step, saves, and exits 75 (which hpc.node.launch turns into 0 and a stop record); restarted
on newest_complete_checkpoint, the run ends at its last step with every step's loss (and grad norm) equal, bit for
bit, to the same run uninterrupted, and the same final weights. A script that does not catch the notice is told so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT
from safetensors.torch import load_file
from train_helpers import clean_env, free_port, tiny_hf_chat

from hpc.integrations.checkpoints import newest_complete_checkpoint
from hpc.node.attempt import read

SCRIPTS = ROOT / "tests" / "scripts"
TRL, ACCELERATE = SCRIPTS / "trl_sft.py", SCRIPTS / "accelerate_requeue.py"


def run(
    nproc: int,
    script: str | Path,
    *args: str,
    wrapped: bool = True,
    record: Path | None = None,
    accelerate: bool = False,
    code: int = 0,
    **env: str,
) -> str:
    """The script on ``nproc`` processes (torchrun --standalone, or accelerate launch on CPU as
    hpc.node.launcher.Accelerate starts it), each behind hpc.node.launch --rank when ``wrapped``, with ``env`` added;
    its output (the run must exit with ``code``)."""
    rank = [PYTHON, "-u", "-m", "hpc.node.launch", "--rank", "--"] if wrapped else []
    if nproc == 1:
        launcher = []
    elif accelerate:
        launcher = [
            PYTHON,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_machines=1",
            f"--num_processes={nproc}",
            "--machine_rank=0",
            "--main_process_ip=127.0.0.1",
            f"--main_process_port={free_port()}",
            "--no_python",
        ]
    else:
        launcher = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--no-python"]
    env = clean_env(
        PYTHONPATH=str(ROOT), ACCELERATE_USE_CPU="true", **({"HPC_STOP_RECORD": str(record)} if record else {}), **env
    )
    r = subprocess.run(
        [*launcher, *rank, PYTHON, str(script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    out = r.stdout + r.stderr
    assert r.returncode == code, out[-4000:]
    return out


def losses(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    model, data = tiny_hf_chat(tmp_path_factory.mktemp("hf"), rows=32)  # 8 optimizer steps an epoch on 1 process
    return ["--model", str(model), "--data", str(data), "--max-steps", "14"]


@pytest.mark.parametrize("nproc,notice_to", [(1, "parent"), (2, "self")], ids=["1-process", "2-processes-ddp"])
def test_trl_script_stops_at_the_notice_saves_and_resumes_exactly(tmp_path, model_and_data, nproc, notice_to):
    """1 process: the notice reaches hpc.node.launch only and the script learns of it through the notice file.
    2 processes: only rank 0 gets it; rank 1 stops after the same step through the all_reduce."""
    base, cut = tmp_path / "base", tmp_path / "cut"
    run(nproc, TRL, *model_and_data, "--out", str(base), wrapped=False)
    record = tmp_path / "stop-record"
    log = run(
        nproc, TRL, *model_and_data, "--out", str(cut), "--notice-at", "5", "--notice-to", notice_to, record=record
    )
    stop = int(log.split("[requeue] stopped at step ")[1].split()[0])
    assert 5 <= stop < 14 and "after SIGUSR2, checkpoint saved; exiting 75" in log
    for rank in range(nproc):
        assert f"rank {rank if nproc > 1 else '?'} on" in log and log.count("stopped cleanly for a requeue") == nproc
    assert record.is_file() and "does not catch it" not in log
    assert newest_complete_checkpoint(cut) == str(cut / f"checkpoint-{stop}")
    assert [r["step"] for r in losses(cut)] == list(range(1, stop + 1))

    attempt = tmp_path / "attempt"  # as in a job with spare nodes: the callback records the resumed step and the steps
    attempt.mkdir()
    log = run(nproc, TRL, *model_and_data, "--out", str(cut), wrapped=False, HPC_ATTEMPT_DIR=str(attempt))
    assert "[requeue]" not in log
    progress = read(attempt).progress
    assert (progress["resumed_step"], progress["step"]) == (stop, 14) and progress["trained_at"] <= progress["step_at"]
    assert losses(cut) == losses(base)  # every step once, the same loss and grad norm, bit for bit
    a, b = load_file(cut / "final" / "model.safetensors"), load_file(base / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_accelerate_loop_stops_at_the_notice_saves_and_resumes_exactly(tmp_path):
    """accelerate launch, 2 processes (MULTI_CPU): dropout, AdamW, a schedule and a shuffled loader over 2.5 epochs;
    the notice reaches rank 0."""
    base, cut = tmp_path / "base", tmp_path / "cut"
    run(2, ACCELERATE, "--out", str(base), wrapped=False, accelerate=True)
    log = run(2, ACCELERATE, "--out", str(cut), "--notice-at", "5", accelerate=True)
    stop = int(log.split("[requeue] stopped at step ")[1].split()[0])
    assert 5 <= stop < 15 and log.count("stopped cleanly for a requeue") == 2
    assert newest_complete_checkpoint(cut / "checkpoints") == str(cut / "checkpoints" / f"step-{stop:08d}")
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    log = run(2, ACCELERATE, "--out", str(cut), wrapped=False, accelerate=True, HPC_ATTEMPT_DIR=str(attempt))
    assert f"[requeue] resumed from {cut / 'checkpoints' / f'step-{stop:08d}'} (step {stop}, batch {stop})" in log
    progress = read(attempt).progress
    # the loop breaks at its last step before stop_if_noticed, which records each step: step 14 is the last recorded
    assert (progress["resumed_step"], progress["step"]) == (stop, 14) and progress["load_started_at"] <= progress[
        "loaded_at"
    ]
    assert [r["step"] for r in losses(cut)] == list(range(1, 16))
    assert losses(cut) == losses(base)


def test_a_hung_rank_is_named_and_its_node_marked_by_the_stop_agreement(tmp_path):
    """Rank 1 stops itself (SIGSTOP) after step 3: rank 0 times out in the agreement after that step
    (HPC_DIST_TIMEOUT_S), names rank 1 and its node, marks the node bad for the batch script, and fails."""
    marks = tmp_path / "marks"
    log = run(
        2,
        ACCELERATE,
        "--out",
        str(tmp_path / "out"),
        "--hang-rank",
        "1",
        "--hang-at",
        "3",
        wrapped=False,
        code=1,
        HPC_DIST_TIMEOUT_S="6",
        HPC_BAD_NODE_MARKS=str(marks),
        SLURMD_NODENAME="n-hung",
    )
    assert "[hang] a collective timed out after step 3 (after " in log
    assert "s): rank 1 on n-hung did not arrive (rank 0 did)" in log and f"[hang] marked n-hung bad in {marks}" in log
    assert sorted(p.name for p in marks.iterdir()) == ["n-hung"]


NO_CATCH = "import os, signal, time; os.kill(os.getppid(), signal.SIGUSR2); time.sleep(2); print('trained on')"


def test_a_script_that_ignores_the_notice_is_told_once_with_the_line_that_helps(tmp_path):
    log = run(1, "-c", NO_CATCH)
    assert log.count("got SIGUSR2, the notice to save and stop, but the script does not catch it") == 1
    assert "trainer.add_callback(RequeueCallback())" in log and "trained on" in log


def test_the_stop_flag_releases_its_gloo_group_at_exit(tmp_path):
    """At exit, while Python is still whole, the flag destroys its group: it leaves torch's registry and its gloo
    worker threads end (one still letting go of a collective once finalization has begun aborts the process)."""
    code = f"""
import os
import torch.distributed as dist
from hpc.node.stop_flag import StopFlag
threads = lambda: len(os.listdir("/proc/self/task"))
dist.init_process_group("gloo", init_method="file://{tmp_path / "store"}", rank=0, world_size=1)
before = threads()
flag = StopFlag({{}})
flag.join(dist.new_group(backend="gloo"))
assert not flag.agreed()
during = threads()
flag._release_group()
print(before, during, threads(), flag.group, len(dist.distributed_c10d._world.pg_map))
"""
    r = subprocess.run(
        [PYTHON, "-c", code], cwd=ROOT, env=clean_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    before, during, after, group, groups = r.stdout.split()
    assert int(during) > int(before) == int(after) and group == "None" and groups == "1"
