"""Submission, rank wiring and quoting proven on the real local Slurm cluster."""

import datetime
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import assert_golden, job_nodes, queued, run_cli, wait_job
from login_helpers import command_line

from hpc.node.slurm_env import master_port
from hpc.slurm_query import scontrol_fields

pytestmark = pytest.mark.slurm


def check_smoke_records(out: Path, job_id: str, nodes: int = 2, per_node: int = 2) -> None:
    """Every rank derived a consistent wiring and the gloo all_reduce summed all ranks."""
    world, hosts = nodes * per_node, job_nodes(job_id)
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert sorted(int(r["rank"]) for r in recs) == list(range(world))
    by_node: dict[str, list[dict]] = {}
    for r in recs:
        assert r["world_size"] == str(world) and r["local_world_size"] == str(per_node)
        assert r["master_addr"] == hosts[0] and r["master_port"] == str(master_port(int(job_id)))
        assert r["job_id"] == job_id
        assert r["allreduce"] == r["expected"] == world * (world + 1) / 2
        assert int(r["rank"]) == int(r["node_rank"]) * per_node + int(r["local_rank"])
        assert r["hostname"] == r["slurmd_nodename"]  # every node has its own namespace and hostname
        by_node.setdefault(r["slurmd_nodename"], []).append(r)
    assert sorted(by_node) == sorted(hosts) and len(hosts) == nodes
    for name, rs in by_node.items():
        assert {r["node_rank"] for r in rs} == {str(hosts.index(name))}
        assert sorted(r["local_rank"] for r in rs) == [str(i) for i in range(per_node)]


def test_submit_wait_runs_2x2_ranks_through_submitit(slurm, tmp_path):
    out = tmp_path / "ranks"
    r = run_cli("-m", "hpc.submit", "--wait", *command_line("submitit", tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted job (\d+)", r.stdout).group(1)
    assert f"job {job_id} finished: COMPLETED" in r.stdout
    assert "[smoke] rank 0/4 all_reduce 10 (expected 10)" in r.stdout  # rank 0's log followed live
    returned = time.time()
    end = subprocess.run(
        ["sacct", "-n", "-X", "-j", job_id, "-o", "End", "--parsable2"], capture_output=True, text=True
    ).stdout.split()
    ended = (
        datetime.datetime.fromisoformat(end[0]).timestamp() if end and end[0] not in ("Unknown", "None") else returned
    )
    assert returned - ended < 10, f"--wait returned {returned - ended:.0f} s after the job ended"
    check_smoke_records(out, job_id)

    # the dry run is the submission: --dry-run prints, and --emit writes, exactly the script submitit submitted
    submitted = (tmp_path / "jobs" / "smoke" / f"{job_id}_submission.sh").read_text()
    assert_golden("submitit", submitted, tmp_path)  # the file tests/unit/test_golden.py renders
    dry = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        "smoke",
        "--dry-run",
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert dry.returncode == 0 and dry.stdout == submitted

    # the same job written with --emit and submitted by hand with plain sbatch
    out2, script = tmp_path / "ranks2", tmp_path / "job.sbatch"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        "smoke",
        "--emit",
        str(script),
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(out2),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert script.read_text() == submitted.replace(str(out), str(out2))
    sb = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert sb.returncode == 0, sb.stderr
    job2 = sb.stdout.strip()
    assert wait_job(job2) == "COMPLETED"
    check_smoke_records(out2, job2)
    assert (tmp_path / "jobs" / "smoke" / f"{job2}_3_log.out").read_text().count("[smoke] rank 3/4") == 1


def test_torchrun_launcher_one_task_per_node(slurm, tmp_path):
    out = tmp_path / "ranks"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--launcher",
        "torchrun",
        "--wait",
        "--job-name",
        "smoke-torchrun",
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted job (\d+)", r.stdout).group(1)
    check_smoke_records(out, job_id)


def test_hostile_job_name_is_only_a_name(slurm, tmp_path):
    marker = tmp_path / "owned"
    name = f"x; touch {marker}; $(touch {marker})"
    script = tmp_path / "job.sbatch"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--job-name",
        name,
        "--emit",
        str(script),
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(tmp_path / "r"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    sb = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=tmp_path)
    job_id = sb.stdout.strip()
    assert wait_job(job_id) == "COMPLETED"
    got = scontrol_fields(job_id)["JobName"]  # slurmctld's record (accounting may lag behind it)
    assert got == name
    assert not marker.exists()


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--launcher", "torchrun"],
        ["--partition", "low", "--gpus-per-node", "1", "--", "parallel.tp=1"],
        ["--job-name", "a b; c $(d)"],
    ],
)
def test_rendered_scripts_pass_sbatch_test_only(slurm, tmp_path, extra):
    script = tmp_path / "job.sbatch"
    r = run_cli("-m", "hpc.submit", "--site", "local", "--nodes", "2", "--emit", str(script), *extra, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    t = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert t.returncode == 0 and "to start at" in t.stderr, t.stderr


def test_directories_of_other_jobs_and_bad_places_are_refused(slurm, tmp_path):
    """A directory another job name created is refused before submitting (an --emit path that is a directory and a
    profile path with an unset variable are survey cases: tests/bad_input_cases.py)."""
    before = queued(tmp_path)
    first = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--job-name",
        "exp 1",
        "--",
        "-m",
        "hpc.node.smoke",
        "--out",
        str(tmp_path / "r"),
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    job = re.search(r"submitted job (\d+)", first.stdout).group(1)
    assert wait_job(job) == "COMPLETED"
    before = queued(tmp_path)
    owned = next((tmp_path / "jobs").iterdir())
    assert owned.name.startswith("exp_1-")
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--job-name",
        "exp_1",
        "--",
        f"log.dir={owned}",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "log.dir" in r.stderr and "belongs to job 'exp 1'" in r.stderr, r.stderr
    assert queued(tmp_path) == before


def test_rank_mismatch_fails_with_what_to_change(slurm, tmp_path):
    from conftest import PYTHON

    wrap = f"srun --ntasks-per-node=1 {PYTHON} -m hpc.node.launch -- {PYTHON} -c 'print(1)'"
    sb = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N",
            "1",
            "--ntasks-per-node=1",
            "--gpus-per-node=2",
            "-o",
            str(tmp_path / "%j.log"),
            "--wrap",
            wrap,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    job_id = sb.stdout.strip()
    assert wait_job(job_id) == "FAILED"
    log = (tmp_path / f"{job_id}.log").read_text()
    assert (
        f"hpc.node.launch: error: {job_nodes(job_id)[0]}: 1 tasks per node but 2 GPUs per node: use --ntasks-per-node=2"
        in log
    )
