"""hpc.submit through real processes: Slurm's clients are fake scripts first on PATH (tests/slurm_fakes.py), which
submitit's sbatch and the status queries run, and a ``-m MODULE`` job's python is asked whether it can import it.
The submit path's logic is tested in process: tests/unit/test_submit_path.py."""

from __future__ import annotations

import pytest
from conftest import GOLDEN_WORKDIR
from login_helpers import command_line
from slurm_fakes import RECORDED, FakeSlurm

from hpc import submit as submit_cli

SUBMITTED = "Submitted batch job 4242\n"  # sbatch's line (without --parsable, as submitit runs it)


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeSlurm:
    slurm = FakeSlurm(tmp_path / "bin")
    for k, v in slurm.environ().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", GOLDEN_WORKDIR.rsplit("/", 1)[0])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return slurm


def test_the_command_line_submits_what_its_dry_run_prints_and_waits_for_the_end(fake, tmp_path, capsys):
    argv = command_line("submitit", tmp_path / "work")
    with pytest.raises(SystemExit) as e:
        submit_cli.main([*argv[: argv.index("--")], "--dry-run", *argv[argv.index("--") :]])
    assert e.value.code == 0
    dry = capsys.readouterr().out
    fake.answer("sbatch", (0, SUBMITTED))
    fake.answer(
        "scontrol",
        (0, RECORDED / "pending.scontrol"),
        (0, RECORDED / "running.scontrol"),
        (0, RECORDED / "completed.scontrol"),
    )
    with pytest.raises(SystemExit) as e:
        submit_cli.main([*argv[: argv.index("--")], "--wait", *argv[argv.index("--") :]])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    assert fake.script() == dry
    assert "submitted job 4242 " in out and "[wait] job 4242 finished: COMPLETED" in out
    assert [line for line in out.splitlines() if line.startswith("[wait] job 4242: ")] == [
        "[wait] job 4242: PENDING",
        "[wait] job 4242: RUNNING",
        "[wait] job 4242: COMPLETED",
    ]


def test_a_module_the_job_s_python_cannot_import_is_refused_before_sbatch(fake, tmp_path, capsys):
    """The check runs the job's python (a process), so it is tested here rather than with the in-process survey."""
    with pytest.raises(SystemExit) as e:
        submit_cli.main(["--site", "local", "--nodes", "2", "--", "-m", "no.such.module"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("hpc.submit: error: ") and "-m no.such.module: no such module" in err, err
    assert fake.calls("sbatch") == [] and not (tmp_path / "work" / "jobs").exists()
