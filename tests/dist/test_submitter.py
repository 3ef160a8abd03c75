"""hpc.submitter against fake Slurm clients on PATH (tests/slurm_fakes.py): submit hands sbatch the dry run's
script and returns the job id sbatch printed; sbatch's refusals are one line; follow reports each state through to
the end, from slurmctld and then from accounting."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from conftest import GOLDEN_WORKDIR, assert_golden
from hpc import submit as submit_cli
from hpc.node.contract import OWNER_FILE
from hpc.render import render_sbatch
from hpc.site import SHIPPED_SITE_DIR
from hpc.spec import SpecError
from hpc.submitter import follow, submit
from login_helpers import command_line
from slurm_fakes import COMMANDS, RECORDED, FakeSlurm

SUBMITTED = "Submitted batch job 4242\n"  # sbatch's line (without --parsable, as submitit runs it)
REFUSED = "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"


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


def spec_of(name: str, workdir):
    own, rank_args = submit_cli.split_args(command_line(name, workdir))
    return submit_cli.planned_spec(submit_cli.parser().parse_args(own), rank_args)[0]


def test_submit_hands_sbatch_the_dry_run_and_returns_its_job_id(fake, tmp_path, capsys):
    fake.answer("sbatch", (0, SUBMITTED))
    work = tmp_path / "work"
    spec = spec_of("submitit", work)
    job = submit(spec)
    assert job.job_id == "4242"
    assert fake.script() == render_sbatch(spec) == job.paths.submission_file.read_text()
    assert_golden("submitit", fake.script(), work)  # the case's golden file: the script Slurm would run
    [argv] = fake.calls("sbatch")
    assert len(argv) == 1 and argv[0].endswith(".sh")  # the script alone: every option is an #SBATCH line in it
    assert fake.calls("squeue") == [["-h", "-o", "%i\x1f%j\x1f%T\x1f%D\x1f%M", "-u", "alice"]]  # no live job of that name


def test_the_command_line_submits_what_its_dry_run_prints_and_waits_for_the_end(fake, tmp_path, capsys):
    argv = command_line("submitit", tmp_path / "work")
    with pytest.raises(SystemExit) as e:
        submit_cli.main([*argv[:argv.index("--")], "--dry-run", *argv[argv.index("--"):]])
    assert e.value.code == 0
    dry = capsys.readouterr().out
    fake.answer("sbatch", (0, SUBMITTED))
    fake.answer("scontrol", (0, RECORDED / "pending.scontrol"), (0, RECORDED / "running.scontrol"),
                (0, RECORDED / "completed.scontrol"))
    with pytest.raises(SystemExit) as e:
        submit_cli.main([*argv[:argv.index("--")], "--wait", *argv[argv.index("--"):]])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    assert fake.script() == dry
    assert "submitted job 4242 " in out and "[wait] job 4242 finished: COMPLETED" in out
    assert [line for line in out.splitlines() if line.startswith("[wait] job 4242: ")] == [
        "[wait] job 4242: PENDING", "[wait] job 4242: RUNNING", "[wait] job 4242: COMPLETED"]


@pytest.mark.parametrize("answer, line", [
    ((1, REFUSED), "hpc.submit: error: sbatch refused the job: sbatch: error: Batch job submission failed: "
                   "Requested node configuration is not available"),
    ((0, "sbatch: warning: something\n"), 'hpc.submit: error: sbatch printed no job id: Could not make sense of sbatch '
                                          'output "sbatch: warning: something"'),
])
def test_a_failed_sbatch_is_one_line_exit_2(fake, tmp_path, capsys, answer, line):
    fake.answer("sbatch", answer)
    with pytest.raises(SystemExit) as e:
        submit_cli.main(command_line("submitit", tmp_path / "work"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines() == [line], err
    assert len(fake.calls("sbatch")) == 1


def test_spec_error_names_sbatch_refusal_with_the_profile_extras(fake, tmp_path):
    fake.answer("sbatch", (1, REFUSED))
    spec = spec_of("submitit", tmp_path / "work")
    with pytest.raises(SpecError, match=r"^sbatch refused the job: sbatch: error: Batch job submission failed: Requested node "
                                        r"configuration is not available$"):
        submit(spec)


def test_follow_reports_each_state_and_the_log_until_the_job_ends(fake, tmp_path, capsys):
    fake.answer("scontrol", *[(0, RECORDED / f"{s}.scontrol") for s in ("pending", "pending", "running", "running", "completed")])
    log = tmp_path / "log.out"
    log.write_text("step 1\n")
    assert follow("122", log, poll_s=0) == "COMPLETED"
    out = capsys.readouterr().out
    assert out.splitlines() == ["[wait] job 122: PENDING", "step 1", "[wait] job 122: RUNNING", "[wait] job 122: COMPLETED"]
    assert fake.calls("scontrol") == [["show", "job", "-o", "122"]] * 5
    assert fake.calls("sacct") == []


def test_follow_reads_accounting_once_slurmctld_forgot_the_job_and_goes_on_after_a_failed_query(fake, tmp_path, capsys):
    fake.answer("scontrol", (0, RECORDED / "running.scontrol"), (1, "slurm_load_jobs error: Invalid job id specified\n"))
    fake.answer("sacct", (1, "sacct: error: Problem talking to the database: Connection refused\n"), (0, RECORDED / "failed.sacct"))
    assert follow("125", tmp_path / "absent.log", poll_s=0) == "FAILED"
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["[wait] job 125: RUNNING", "[wait] job 125: FAILED"]
    assert captured.err.splitlines() == ["[wait] job 125: sacct failed: sacct: error: Problem talking to the database: Connection refused"]
    assert [c[c.index("-j"):] for c in fake.calls("sacct")] == [["-j", "125"]] * 2


def test_follow_ends_early_when_the_deadline_says_so(fake, tmp_path, capsys):
    fake.answer("scontrol", (0, RECORDED / "pending.scontrol"), (0, RECORDED / "running.scontrol"))
    seen = []
    state = follow("123", tmp_path / "absent.log", poll_s=0, deadline=lambda s, started: seen.append((s, started is None)) or len(seen) == 3)
    assert state == "RUNNING" and seen == [("PENDING", True), ("RUNNING", False), ("RUNNING", False)]


def test_a_module_the_job_s_python_cannot_import_is_refused_before_sbatch(fake, tmp_path, capsys):
    """The check runs the job's python (a process), so it is tested here rather than with the in-process survey."""
    with pytest.raises(SystemExit) as e:
        submit_cli.main(["--site", "local", "--nodes", "2", "--", "-m", "no.such.module"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("hpc.submit: error: ") and "-m no.such.module: no such module" in err, err
    assert fake.calls("sbatch") == [] and not (tmp_path / "work" / "jobs").exists()


def test_slurm_is_asked_only_once_the_script_leaves_the_dry_run(fake, tmp_path, monkeypatch, capsys):
    """A dry run sets no SLURM_CONF, runs no Slurm client and writes nothing; --emit points the clients at the profile's
    slurm.conf and looks up the --after job before writing; a submission also looks for a live job of the name and
    claims the job directory."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=fake\n")  # no SlurmctldHost: no controller to probe
    site = yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text())
    site["submission"]["slurm_conf"] = str(conf)
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    monkeypatch.delenv("SLURM_CONF")
    work = tmp_path / "work"
    argv = ["--site", str(tmp_path / "site.yaml"), "--nodes", "1", "--job-name", "chained", "--after", "122", "--", "-m", "hpc.node.smoke"]

    def run(*flags: str) -> str:
        with pytest.raises(SystemExit) as e:
            submit_cli.main([*argv[:-3], *flags, *argv[-3:]])
        out, err = capsys.readouterr()
        assert e.value.code == 0, err
        return out

    assert "#SBATCH --dependency=afterok:122" in run("--dry-run")
    assert "SLURM_CONF" not in os.environ and list(work.iterdir()) == []
    assert not any(fake.calls(c) for c in COMMANDS)
    fake.answer("scontrol", (0, RECORDED / "pending.scontrol"))  # job 122 is known
    run("--emit", str(work / "job.sbatch"))
    assert os.environ["SLURM_CONF"] == str(conf) and [c[-1] for c in fake.calls("scontrol")] == ["122"]
    assert fake.calls("squeue") == [] and not (work / "jobs" / "chained" / OWNER_FILE).exists()
    fake.answer("sbatch", (0, SUBMITTED))
    assert "submitted job 4242 " in run()
    assert [c[-1] for c in fake.calls("scontrol")] == ["122", "122"] and len(fake.calls("squeue")) == 1
    assert json.loads((work / "jobs" / "chained" / OWNER_FILE).read_text()) == {"job_name": "chained"}
