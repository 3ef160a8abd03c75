"""Node network checks: NCCL/gloo interface and HCA selection, on this machine's real interfaces,
through hpc.node.launch, and the bounded rendezvous timeout on the real cluster."""

import subprocess

import pytest
from conftest import PYTHON, ROOT, slurm_task_env

from hpc.node.netcheck import DEFAULT_DIST_TIMEOUT_S


def test_launch_fails_fast_naming_node_and_interfaces():
    r = subprocess.run(
        [PYTHON, "-m", "hpc.node.launch", "--", PYTHON, "-c", "print('ran')"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_task_env(GLOO_SOCKET_IFNAME="ib0"),
    )
    assert r.returncode == 2 and "ran" not in r.stdout
    assert r.stderr.startswith(
        "hpc.node.launch: error: here: GLOO_SOCKET_IFNAME=ib0 but this node has no interface ib0; it has lo (127.0.0.1"
    )
    assert r.stderr.count("\n") == 1


def test_launch_exports_the_timeout_and_reports_the_interfaces():
    code = "import os; print('timeout', os.environ['HPC_DIST_TIMEOUT_S'])"
    r = subprocess.run(
        [PYTHON, "-m", "hpc.node.launch", "--", PYTHON, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_task_env(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="=lo"),
    )
    assert r.returncode == 0, r.stderr
    assert "[netcheck] here: gloo lo (127.0.0.1" in r.stdout and f"timeout {DEFAULT_DIST_TIMEOUT_S}" in r.stdout
    r = subprocess.run(
        [PYTHON, "-m", "hpc.node.launch", "--", PYTHON, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_task_env(HPC_DIST_TIMEOUT_S="never"),
    )
    assert r.returncode == 2 and "HPC_DIST_TIMEOUT_S='never' must be a positive number" in r.stderr


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID='12_3' is not a whole number"),
        ({"SLURM_NTASKS": "two"}, "SLURM_NTASKS='two' is not a whole number"),
        ({"SLURM_PROCID": "1"}, "SLURM_PROCID=1 but the step has 1 tasks (allowed 0 to 0)"),
        ({"SLURM_NODEID": "3"}, "SLURM_NODEID=3 but the step has 1 nodes (allowed 0 to 0)"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 but the node runs 1 tasks (allowed 0 to 0)"),
    ],
)
def test_launch_refuses_impossible_wiring_in_one_line(extra, message):
    r = subprocess.run(
        [PYTHON, "-m", "hpc.node.launch", "--", PYTHON, "-c", "print('ran')"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_task_env(**extra),
    )
    assert r.returncode == 2 and "ran" not in r.stdout
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_launch_of_a_missing_program_is_one_line():
    r = subprocess.run(
        [PYTHON, "-m", "hpc.node.launch", "--", "/nonexistent/python", "-c", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_task_env(),
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "hpc.node.launch: error: rank 0 on here: cannot run '/nonexistent/python': No such file or directory"
    ]


def test_a_clean_stop_is_exit_0_with_a_stop_record_and_failures_pass_through(tmp_path):
    record = tmp_path / "stop"
    for code, rc in ((75, 0), (3, 3), (0, 0)):
        record.unlink(missing_ok=True)
        r = subprocess.run(
            [PYTHON, "-m", "hpc.node.launch", "--", PYTHON, "-c", f"raise SystemExit({code})"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=slurm_task_env(HPC_STOP_RECORD=str(record)),
        )
        assert r.returncode == rc, r.stderr
        assert record.exists() == (code == 75)
        if code == 75:
            assert "rank 0 on here stopped cleanly (exit 75)" in record.read_text()
