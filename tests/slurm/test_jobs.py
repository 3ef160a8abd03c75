"""Users' own accelerate/torchrun scripts across 2 nodes, and hpc.jobs, on the real local cluster."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, job_nodes, run_cli, wait_job

from hpc.metrics_report import fmt
from hpc.node.slurm_env import master_port
from hpc.slurm_query import scontrol_fields

pytestmark = pytest.mark.slurm
SCRIPTS = ROOT / "tests" / "scripts"


def check_records(out: Path, job: str, nodes: int = 2, per_node: int = 2) -> list[dict]:
    """World size, rank layout over the job's nodes, the cross-node reduce and DDP-equal weights on every rank."""
    recs = sorted((json.loads(p.read_text()) for p in out.glob("rank-*.json")), key=lambda r: r["rank"])
    world, hosts = nodes * per_node, job_nodes(job)
    assert [r["rank"] for r in recs] == list(range(world))
    for r in recs:
        node = r["rank"] // per_node
        assert r["world_size"] == world and r["allreduce"] == world * (world + 1) / 2
        assert int(r.get("node_rank", r.get("group_rank"))) == node
        assert r["hostname"] == r["slurmd_nodename"] == hosts[node]  # each node its own namespace
    assert len({r["weights_checksum"] for r in recs}) == 1
    return recs


def test_accelerate_script_on_2_nodes_then_status_logs_report(slurm, tmp_path):
    out = tmp_path / "ranks"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--launcher",
        "accelerate",
        "--wait",
        "--job-name",
        "acc",
        "--",
        str(SCRIPTS / "accelerate_train.py"),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    recs = check_records(out, job)
    hosts = job_nodes(job)
    assert {r["distributed_type"] for r in recs} == {"DistributedType.MULTI_CPU"}
    assert recs[0]["gathered"] == [0, 1, 2, 3]

    metrics = [json.loads(line) for line in (tmp_path / "jobs" / "acc" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    st = run_cli("-m", "hpc.jobs", "status", job)
    assert st.returncode == 0, st.stderr
    assert (
        f"job {job} (acc): COMPLETED" in st.stdout
        and f"2 node(s) {scontrol_fields(job)['NodeList']}" in st.stdout
        and "restarts 0" in st.stdout
    )
    assert (
        f"last step 8: loss {fmt(metrics[-1]['loss'])}, {fmt(metrics[-1]['tokens_per_s'])} tokens/s, MFU n/a"
        in st.stdout
    )

    log0 = run_cli("-m", "hpc.jobs", "logs", job)
    assert "[accelerate_train] 4 processes, DistributedType.MULTI_CPU, reduce 10" in log0.stdout
    log1 = run_cli("-m", "hpc.jobs", "logs", job, "--rank", "1")
    assert (
        f"[launch] {hosts[1]} job {job}" in log1.stdout and f"[launch] {hosts[0]}" not in log1.stdout
    )  # task 1 = 2nd node

    png, tb = tmp_path / "report.png", tmp_path / "tb"
    rep = run_cli("-m", "hpc.jobs", "report", job, "--out", str(png), "--tensorboard", str(tb))
    assert rep.returncode == 0, rep.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loss_row = next(line for line in rep.stdout.splitlines() if line.startswith("loss "))
    assert loss_row.split()[1:3] == [fmt(metrics[0]["loss"]), fmt(metrics[-1]["loss"])]
    assert next(line for line in rep.stdout.splitlines() if line.startswith("mfu ")).split()[1:] == ["n/a"] * 5

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tb))
    ea.Reload()
    got = [(e.step, e.value) for e in ea.Scalars("train/loss")]
    assert got == [(m["step"], pytest.approx(m["loss"])) for m in metrics]


def test_torchrun_script_emitted_and_followed(slurm, tmp_path):
    out, script = tmp_path / "ranks", tmp_path / "job.sbatch"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "2",
        "--launcher",
        "torchrun",
        "--job-name",
        "tr run",
        "--emit",
        str(script),
        "--",
        str(SCRIPTS / "torchrun_train.py"),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "$SLURM_NODEID" not in script.read_text()
    sb = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=tmp_path)
    job = sb.stdout.strip()
    follow = run_cli("-m", "hpc.jobs", "logs", job, "-f", "--rank", "1", timeout=300)  # returns when the job ends
    logs = "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted((tmp_path / "jobs" / "tr_run").glob("*.log")))
    assert follow.returncode == 0, follow.stderr + logs
    hosts = job_nodes(job)
    assert f"[launch] {hosts[1]} job {job}" in follow.stdout
    assert (
        "[torchrun_train] rank 2/4 all_reduce 10" in follow.stdout
        and "[torchrun_train] rank 3/4 all_reduce 10" in follow.stdout
    )
    assert follow.stderr.strip().endswith(f"job {job} ended: COMPLETED")
    recs = check_records(out, job)
    assert {(r["master_addr"], r["master_port"], r["local_world_size"]) for r in recs} == {
        (hosts[0], str(master_port(int(job))), "2")
    }


def test_requeue_counts_as_restart_and_cancel(slurm, tmp_path):
    sb = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N",
            "1",
            "--requeue",
            "-J",
            "sleeper",
            "-o",
            str(tmp_path / "%j.log"),
            "--wrap",
            "sleep 300",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    job = sb.stdout.strip()
    try:
        deadline = time.time() + 900  # the other worker's jobs may hold the nodes
        while (
            subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
            != "RUNNING"
        ):
            assert time.time() < deadline, "the job did not start"
            time.sleep(0.5)
        assert subprocess.run(["scontrol", "requeue", job]).returncode == 0
        st = run_cli("-m", "hpc.jobs", "status", job)
        assert f"job {job} (sleeper): PENDING" in st.stdout and "restarts 1" in st.stdout, st.stdout
        row = next(
            line.split() for line in run_cli("-m", "hpc.jobs", "list").stdout.splitlines() if line.split()[0] == job
        )
        assert row[1] == "sleeper" and row[-1] == "1"
        c = run_cli("-m", "hpc.jobs", "cancel", job)
        assert c.returncode == 0 and c.stdout.strip() == f"cancelled job {job} (sleeper, was PENDING)"
        assert wait_job(job, timeout=60) == "CANCELLED"
        again = run_cli("-m", "hpc.jobs", "cancel", job)
        assert again.returncode == 0 and "already ended: CANCELLED" in again.stdout
    finally:
        subprocess.run(["scancel", job])


def test_a_new_job_is_listed_at_once_with_its_name(slurm, tmp_path):
    """slurmctld's view comes first: accounting records a new job a moment later, as "allocation"."""
    sb = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--hold",
            "-N",
            "1",
            "-J",
            "fresh job",
            "-o",
            str(tmp_path / "%j.log"),
            "--wrap",
            "true",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    job = sb.stdout.strip()
    try:
        listed = [line for line in run_cli("-m", "hpc.jobs", "list").stdout.splitlines() if line.split()[0] == job]
        assert len(listed) == 1 and listed[0].split()[1:4] == ["fresh", "job", "PENDING"], listed
        assert run_cli("-m", "hpc.jobs", "status", job).stdout.startswith(f"job {job} (fresh job): PENDING")
    finally:
        subprocess.run(["scancel", job])


UNKNOWN_JOB = "987654321"


@pytest.mark.parametrize(
    "args,message",
    [
        (["-m", "hpc.jobs", "status", UNKNOWN_JOB], f"hpc.jobs: error: job {UNKNOWN_JOB} does not exist"),
        (["-m", "hpc.jobs", "logs", UNKNOWN_JOB, "-f"], f"hpc.jobs: error: job {UNKNOWN_JOB} does not exist"),
        (["-m", "hpc.jobs", "cancel", UNKNOWN_JOB], f"hpc.jobs: error: job {UNKNOWN_JOB} does not exist"),
        (["-m", "hpc.jobs", "report", UNKNOWN_JOB], f"hpc.jobs: error: job {UNKNOWN_JOB} does not exist"),
    ],
)
def test_errors_are_one_line_exit_2(slurm, tmp_path, args, message):
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(message), r.stderr
    assert not (tmp_path / "jobs").exists()


def test_jobs_commands_work_without_accounting_and_fail_fast_without_slurm(slurm, tmp_path):
    """slurmdbd out of reach: status, logs, list and cancel answer from slurmctld; slurmctld unreachable: one line in
    seconds."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('sleeper up', flush=True)\ntime.sleep(120)\n")
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--job-name",
        "no-acct",
        "--",
        str(sleeper),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    conf = Path(slurm["SLURM_CONF"]).read_text()
    # accounting out of reach for this test's commands alone: the other tests' jobs keep slurmdbd
    no_acct = tmp_path / "no-acct.conf"
    no_acct.write_text(re.sub(r"(?m)^AccountingStoragePort=.*$", "AccountingStoragePort=6999", conf))
    env = {"SLURM_CONF": str(no_acct)}
    assert subprocess.run(["sacct", "-n", "-X", "-j", job], capture_output=True, env={**os.environ, **env}).returncode
    log = tmp_path / "jobs" / "no-acct" / f"{job}_0_log.out"
    deadline = time.time() + 900  # the other worker's jobs may hold the nodes
    while "sleeper up" not in (log.read_text() if log.exists() else ""):
        assert time.time() < deadline, "the job did not start"
        time.sleep(0.5)
    status = run_cli("-m", "hpc.jobs", "status", job, cwd=tmp_path, env=env)
    assert status.returncode == 0 and f"job {job} (no-acct): RUNNING" in status.stdout, status.stdout + status.stderr
    logs = run_cli("-m", "hpc.jobs", "logs", job, cwd=tmp_path, env=env)
    assert logs.returncode == 0 and "sleeper up" in logs.stdout, logs.stderr
    listed = run_cli("-m", "hpc.jobs", "list", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and re.search(rf"^{job}\s+no-acct\s+RUNNING", listed.stdout, re.M), (
        listed.stdout + listed.stderr
    )
    assert "sacct" in listed.stderr  # says that accounting did not answer
    cancel = run_cli("-m", "hpc.jobs", "cancel", job, cwd=tmp_path, env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert wait_job(job, timeout=60) == "CANCELLED"
    dead = tmp_path / "dead.conf"
    dead.write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=6999", Path(slurm["SLURM_CONF"]).read_text()))
    t0 = time.time()
    r = run_cli("-m", "hpc.jobs", "list", cwd=tmp_path, env={"SLURM_CONF": str(dead)})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Slurm's controller does not answer at" in r.stderr, (
        r.stderr
    )
    assert time.time() - t0 < 8
