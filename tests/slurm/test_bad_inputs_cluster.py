"""The bad-input cases that need the local cluster (the rest run in-process: tests/unit/test_bad_inputs.py):
sbatch's own refusals, a live job of the same name, and hpc.jobs on a job that exists. Each is one line, exit 2,
and queues nothing from its directory."""

from __future__ import annotations

import subprocess

import pytest
from bad_input_cases import site_yaml
from conftest import queued, run_cli, wait_job

pytestmark = pytest.mark.slurm
PREFIX = "badinput-"


def site_with(tmp_path, **changes) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(site_yaml(**changes).replace("{T}", str(tmp_path)))
    return str(path)


@pytest.mark.parametrize(
    "option,value",
    [("constraint", "nosuchfeature"), ("no-such-option", "1"), ("mail-type", "SOMETIMES"), ("exclusive", "bogus")],
)
def test_sbatch_refusal_is_one_line_naming_the_option(slurm, tmp_path, option, value):
    (tmp_path / "s.py").write_text("print('ran')\n")
    site = site_with(tmp_path, submission__extra_sbatch={option: value})
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        site,
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--job-name",
        f"{PREFIX}{option}",
        "--",
        str(tmp_path / "s.py"),
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and option in r.stderr, r.stderr
    assert queued(tmp_path) == []


def test_a_live_job_of_the_same_name_is_refused(slurm, tmp_path):
    (tmp_path / "s.py").write_text("print('ran')\n")
    held = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-J",
            f"{PREFIX}dup",
            "-N",
            "1",
            "-n",
            "1",
            "-t",
            "5",
            "--hold",
            "-o",
            str(tmp_path / "held.out"),
            "--wrap",
            "sleep 60",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    try:
        r = run_cli(
            "-m",
            "hpc.submit",
            "--site",
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--time",
            "5",
            "--job-name",
            f"{PREFIX}dup",
            "--",
            str(tmp_path / "s.py"),
            cwd=tmp_path,
        )
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--job-name" in r.stderr, r.stderr
        assert queued(tmp_path) == [held.stdout.strip().split(";")[0]]  # the held one only
    finally:
        subprocess.run(["scancel", held.stdout.strip().split(";")[0]])


def jobs_in_process(capsys, *args: str) -> tuple[int, str]:
    """hpc.jobs's main(ARGS) in this process: its exit status and stderr."""
    import signal

    from hpc.jobs import main

    saved = signal.getsignal(signal.SIGPIPE)
    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = 0 if e.code is None else e.code
    finally:
        signal.signal(signal.SIGPIPE, saved)  # main sets SIGPIPE's default action; the test process keeps its own
    return code, capsys.readouterr().err


def test_jobs_commands_on_a_finished_job(slurm, tmp_path, monkeypatch, capsys):
    """hpc.jobs in process against a real finished job (its process's side: tests/slurm/test_jobs.py)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "jobs" / "fixture"
    out.mkdir(parents=True)
    job = (
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-J",
                f"{PREFIX}fixture",
                "-N",
                "1",
                "-n",
                "1",
                "-t",
                "2",
                "-o",
                str(out / "%j_0_log.out"),
                "--wrap",
                "echo fixture done",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )
    assert wait_job(job, timeout=120) == "COMPLETED"
    for args, names in (
        (["logs", job, "--rank", "9"], "task 9"),
        (["report", job], "metrics"),
        (["logs", job, "--rank", "-1"], "--rank"),
        (["report", job, "--out", str(tmp_path / "r.xyz")], "--out"),
    ):
        code, err = jobs_in_process(capsys, *args)
        assert code == 2 and err.count("\n") == 1 and names in err, (args, err)
    for args in (["status", job], ["logs", job], ["cancel", job]):
        code, err = jobs_in_process(capsys, *args)
        assert code == 0 and "Traceback" not in err, (args, err)
    assert sorted(p.name for p in out.iterdir()) == [f"{job}_0_log.out"]  # nothing written beside the log
