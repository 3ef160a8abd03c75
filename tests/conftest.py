"""Shared by the tiers: the project's paths, a command line run as a user would, a Slurm task's environment, waiting
for a Slurm job, and the fixtures several tiers ask for (the chat tokenizer and source, torchao's float8)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# The files that take longest in their tier (the sums of their tests: CI's closing table, scripts/tier_times.py, and
# --durations), handed out first so that the workers finish together (scripts/test.sh keeps this order with
# --no-loadscope-reorder); the others follow in their usual order.
LONGEST_FIRST = (
    "slurm/test_requeue.py",
    "slurm/test_spares.py",
    "slurm/test_recovery.py",
    "slurm/test_container.py",
    "slurm/test_hang.py",
    "slurm/test_integrations.py",
    "slurm/test_standby.py",
    "slurm/test_heartbeat.py",
    "slurm/test_sweep.py",
    "slurm/test_straggler.py",
    "slurm/test_snapshots.py",
    "slurm/test_preflight.py",
    "slurm/test_cluster.py",
    "dist/test_checkpoint_safety.py",
    "dist/test_integrations.py",
    "dist/test_train_parallel.py",
    "dist/test_gpu_suite.py",
    "dist/test_chat_train.py",
    "dist/test_memory_snapshots.py",
    "dist/test_moe_parallel.py",
    "dist/test_straggler.py",
    "dist/test_hang.py",
    "dist/test_lora_layouts.py",
    "dist/test_context_parallel.py",
    "dist/test_batch_split.py",
    "dist/test_build_memory.py",
)


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(f"{item.path.parent.name}/{item.path.name}", len(rank)))


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python ARGS` as a user would, capturing text output."""
    return subprocess.run(
        [PYTHON, *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def wait_job(job_id: str, timeout: float = 300) -> str:
    """Block until Slurm reports a final state for the job; returns it."""
    from hpc.node.contract import ENDED_STATES
    from hpc.slurm_query import job_state

    deadline = time.time() + timeout
    while time.time() < deadline:
        state = job_state(job_id)
        if state in ENDED_STATES:
            return state
        time.sleep(1)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s")


def run_seconds(job_id: str) -> int:
    """How long an ended job ran, its time in the queue left out (the other worker's jobs may hold the nodes)."""
    from hpc.slurm_query import scontrol_fields

    days, _, clock = scontrol_fields(job_id)["RunTime"].rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


GOLDEN = ROOT / "tests" / "golden"
GOLDEN_WORKDIR, GOLDEN_PYTHON = "/home/alice/project", "/opt/venv/bin/python"


def assert_golden(name: str, script: str, workdir: Path) -> None:
    """``script`` (rendered or submitted from ``workdir``) equals tests/golden/NAME.sbatch, with the machine's paths
    written as a fixed workdir, python and {PROJECT}; UPDATE_GOLDEN=1 writes the file instead."""
    from hpc.node.runtime import runtime

    text = (
        script.replace(str(workdir.resolve()), GOLDEN_WORKDIR)
        .replace(PYTHON, GOLDEN_PYTHON)
        .replace(str(ROOT), "{PROJECT}")
    )
    for var, version in runtime().items():  # this machine's python, project and torch versions
        text = text.replace(f"export {var}={shlex.quote(version or '')}\n", f"export {var}={{{var}}}\n")
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; review the change and refresh it with UPDATE_GOLDEN=1"


def job_nodes(job_id: str) -> list[str]:
    """The nodes Slurm gave the job, in order (other jobs may hold any node, so tests never assume n1, n2)."""
    import hostlist

    from hpc.slurm_query import scontrol_fields

    return hostlist.expand_hostlist(scontrol_fields(job_id)["NodeList"])


def queued(workdir: Path) -> list[str]:
    """The jobs slurmctld knows (running, pending or ended within MinJobAge) that were submitted from ``workdir``."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i %Z"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(job for job, _, where in (line.partition(" ") for line in out.splitlines()) if where == str(workdir))


def slurm_task_env(**extra: str) -> dict:
    """The variables Slurm gives the single task of a one-node step."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_", "GLOO_", "HPC_"))}
    env.update(
        SLURM_JOB_ID="7",
        SLURM_PROCID="0",
        SLURM_NTASKS="1",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        SLURM_JOB_NUM_NODES="1",
        SLURM_JOB_NODELIST="here",
        SLURM_TASKS_PER_NODE="1",
        SLURMD_NODENAME="here",
    )
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def tok():
    """The demo chat tokenizer."""
    from train.data.tokenizer import load_tokenizer
    from train.front.tokenizer import DEMO_CHAT_TOKENIZER_DIR

    return load_tokenizer(str(DEMO_CHAT_TOKENIZER_DIR))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The first data_helpers.LINES chats of the demo chat data, as a file."""
    from data_helpers import LINES

    from train.front.data_sources import DEMO_CHAT

    path = tmp_path_factory.mktemp("src") / "chat.jsonl"
    with DEMO_CHAT.open() as f:
        path.write_text("".join(next(f) for _ in range(LINES)))
    return path


@pytest.fixture
def torchao_float8():
    """torchao.float8, from train_helpers.FP8_SITE."""
    from train_helpers import FP8_SITE

    if str(FP8_SITE) not in sys.path:
        sys.path.insert(0, str(FP8_SITE))
    try:
        import torchao.float8
    except ImportError:
        pytest.fail(f"torchao is not in {FP8_SITE}: run scripts/install.sh")
    return torchao.float8
