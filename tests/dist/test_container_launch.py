"""Containers with processes: a command prefix through bash, --container on the command line, and hpc.node.launch
keeping a wrapper that does not forward signals alive until the rank program inside has saved."""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import run_cli, slurm_task_env
from login_helpers import WORKDIR, profile, spec_for

from hpc.render import launch_argv, render_sbatch


def test_command_prefix_fills_placeholders_and_is_quoted(tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    path = profile(
        tmp_path,
        {
            "runtime": "command",
            "image": "my img",
            "command": ["wrap", "--in={image}", "--cd", "{workdir}", "{job_dir}/x", "$(touch /tmp/owned)", "--"],
        },
    )
    spec = spec_for(path)
    argv = launch_argv(spec)
    assert shlex.split(argv[7]) == [
        "wrap",
        "--in=my img",
        "--cd",
        str(WORKDIR),
        f"{WORKDIR}/jobs/train/x",
        "$(touch /tmp/owned)",
        "--",
    ]
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    line = next(ln for ln in script.read_text().splitlines() if "-m hpc.node.launch" in ln).removesuffix(" || rc=$?")
    assert shlex.split(line)[shlex.split(line).index("--container") + 1] == argv[7]  # one word through the shell


def test_container_flag_needs_a_runtime_and_a_place_for_the_image(tmp_path):
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--container",
        "pt.sif",
        "--dry-run",
        "--",
        "-m",
        "hpc.node.smoke",
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        "hpc.submit: error: --container pt.sif: site local has no container section for partition debug "
        "(add container: with a runtime to the profile)\n"
    )
    path = profile(tmp_path, {"runtime": "command", "command": ["env", "--"]})
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        str(path),
        "--nodes",
        "1",
        "--container",
        "x",
        "--dry-run",
        "--",
        "-m",
        "hpc.node.smoke",
    )
    assert r.returncode == 2
    assert (
        r.stderr == "hpc.submit: error: --container x: runtime command of this profile has no {image} in its command, "
        "so an image has no place\n"
    )


RANK_PROGRAM = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
got = []
for sig in (signal.SIGUSR2, signal.SIGTERM):
    signal.signal(sig, lambda s, f: got.append(signal.Signals(s).name))
(out / "ready").write_text(str(os.getpid()))
while not got:
    time.sleep(0.05)
time.sleep(1)  # saving: the wrapper and hpc.node.launch must outlive this
(out / "saved").write_text(" ".join(got))
sys.exit(75)
"""


def descendants(pid: int) -> list[int]:
    kids = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    return kids + [d for k in kids for d in descendants(k)]


@pytest.mark.parametrize("who", ["every process", "hpc.node.launch only"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR2"])
def test_a_stop_signal_reaches_the_rank_behind_a_wrapper_that_does_not_forward_it(tmp_path, who, sig):
    """bubblewrap neither forwards signals nor survives a SIGTERM; behind hpc.node.launch it lives until the rank has
    saved, whether the signal reaches every process of the step (Slurm's proctrack) or hpc.node.launch alone."""
    bwrap = shutil.which("bwrap")
    assert bwrap, "bubblewrap is not installed (scripts/install.sh installs it)"
    program = tmp_path / "rank.py"
    program.write_text(RANK_PROGRAM)
    record = tmp_path / "stop-record"
    env = slurm_task_env(
        GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="=lo", HPC_STOP_RECORD=str(record), HPC_STOP_SIGNAL="USR2"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpc.node.launch",
            "--container",
            f"{bwrap} --dev-bind / / --die-with-parent --",
            "--",
            sys.executable,
            str(program),
            str(tmp_path),
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    tree = []
    try:
        deadline = time.time() + 60
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        tree = [proc.pid, *descendants(proc.pid)]
        assert len(tree) >= 3  # hpc.node.launch, bwrap, the rank
        for pid in tree if who == "every process" else tree[:1]:
            os.kill(pid, getattr(signal, sig))
        out = proc.communicate(timeout=60)[0]
    finally:
        for pid in reversed(tree):  # nothing of this test outlives it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert proc.returncode == 0, out
    assert (tmp_path / "saved").read_text().split()[0] == sig
    assert "stopped cleanly (exit 75)" in record.read_text() and "stopped cleanly for a requeue" in out


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--container", "bwrap 'x"], '--container "bwrap \'x": not shell words (No closing quotation)'),
        (["--rank", "--container", "bwrap --"], "--container is for the task's launcher, not for one --rank"),
    ],
)
def test_launch_refuses_a_container_it_cannot_use(flags, message):
    r = run_cli("-m", "hpc.node.launch", *flags, "--", "true")
    assert r.returncode == 2 and r.stderr == f"python -m hpc.node.launch: error: {message} (see --help)\n"
