"""hpc.submitter.submit and follow, and hpc.submit's command line, in process against Slurm's clients faked as
submitit's MockedSubprocess fakes them (tests/slurm_fakes.py: InProcessSlurm, answering with outputs recorded from real
jobs): submit hands sbatch the dry run's script and returns the job id sbatch printed; sbatch's refusals are one line;
follow reports each state through to the end, from slurmctld and then from accounting; Slurm is asked nothing until
the script leaves the dry run. tests/dist/test_submitter.py runs the same path through real processes."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from conftest import GOLDEN_WORKDIR, assert_golden
from login_helpers import command_line
from slurm_fakes import COMMANDS, RECORDED, InProcessSlurm

from hpc import submit as submit_cli
from hpc.node.contract import OWNER_FILE
from hpc.render import render_sbatch
from hpc.site import SHIPPED_SITE_DIR
from hpc.spec import SpecError
from hpc.submitter import follow, submit

SUBMITTED = "Submitted batch job 4242\n"  # sbatch's line (without --parsable, as submitit runs it)
REFUSED = "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"
CASE = "local"  # a golden case: the trainer on the local profile's 2 nodes


@pytest.fixture
def fake(tmp_path, monkeypatch) -> InProcessSlurm:
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", GOLDEN_WORKDIR.rsplit("/", 1)[0])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return InProcessSlurm(monkeypatch, tmp_path / "bin")


def spec_of(name: str, workdir):
    own, rank_args = submit_cli.split_args(command_line(name, workdir))
    return submit_cli.planned_spec(submit_cli.parser().parse_args(own), rank_args)[0]


def main(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        submit_cli.main(argv)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_submit_hands_sbatch_the_dry_run_and_returns_its_job_id(fake, tmp_path):
    fake.answer("sbatch", (0, SUBMITTED))
    work = tmp_path / "work"
    spec = spec_of(CASE, work)
    job = submit(spec)
    assert job.job_id == "4242"
    assert fake.script() == render_sbatch(spec) == job.paths.submission_file.read_text()
    assert_golden(CASE, fake.script(), work)  # the case's golden file: the script Slurm would run
    [argv] = fake.calls("sbatch")
    assert len(argv) == 1 and argv[0].endswith(".sh")  # the script alone: every option is an #SBATCH line in it
    assert fake.calls("squeue") == [
        ["-h", "-o", "%i\x1f%j\x1f%T\x1f%D\x1f%M", "-u", "alice"]
    ]  # no live job of that name
    assert json.loads((work / "jobs" / spec.job_name / OWNER_FILE).read_text()) == {"job_name": spec.job_name}


def test_the_command_line_submits_what_its_dry_run_prints_and_waits_for_the_end(fake, tmp_path, capsys):
    argv = command_line(CASE, tmp_path / "work")
    code, dry, err = main([*argv, "--dry-run"], capsys)
    assert code == 0, err
    assert not any(fake.calls(c) for c in COMMANDS)
    fake.answer("sbatch", (0, SUBMITTED))
    states = ("pending", "running", "completed")
    fake.answer("scontrol", *[(0, RECORDED / f"{s}.scontrol") for s in states])
    code, out, err = main([*argv, "--wait"], capsys)
    assert code == 0, err
    assert fake.script() == dry
    assert "submitted job 4242 " in out and "[wait] job 4242 finished: COMPLETED" in out
    assert [line for line in out.splitlines() if line.startswith("[wait] job 4242: ")] == [
        "[wait] job 4242: PENDING",
        "[wait] job 4242: RUNNING",
        "[wait] job 4242: COMPLETED",
    ]
    assert fake.calls("scontrol") == [["show", "job", "-o", "4242"]] * 3


@pytest.mark.parametrize(
    "answer, line",
    [
        (
            (1, REFUSED),
            "hpc.submit: error: sbatch refused the job: sbatch: error: Batch job submission failed: "
            "Requested node configuration is not available",
        ),
        (
            (0, "sbatch: warning: something\n"),
            'hpc.submit: error: sbatch printed no job id: Could not make sense of sbatch output "sbatch: warning: '
            'something"',
        ),
    ],
)
def test_a_failed_sbatch_is_one_line_exit_2(fake, tmp_path, capsys, answer, line):
    fake.answer("sbatch", answer)
    code, _, err = main(command_line(CASE, tmp_path / "work"), capsys)
    assert code == 2 and err.splitlines() == [line], err
    assert len(fake.calls("sbatch")) == 1


def test_sbatch_s_refusal_names_the_profile_s_extra_options(fake, tmp_path):
    fake.answer("sbatch", (1, REFUSED))
    with pytest.raises(SpecError, match=r"^sbatch refused the job: sbatch: error: Batch job submission failed: "):
        submit(spec_of(CASE, tmp_path / "work"))
    site = yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text())
    site["submission"]["extra_sbatch"] = {"constraint": "fast"}
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    own, rank_args = submit_cli.split_args(["--site", str(tmp_path / "site.yaml"), "--nodes", "1"])
    spec = submit_cli.planned_spec(submit_cli.parser().parse_args(own), rank_args)[0]
    with pytest.raises(
        SpecError, match=r"not available \(the profile's submission\.extra_sbatch adds --constraint=fast\)$"
    ):
        submit(spec)


def test_follow_reports_each_state_and_the_log_until_the_job_ends(fake, tmp_path, capsys):
    states = ("pending", "pending", "running", "running", "completed")
    fake.answer("scontrol", *[(0, RECORDED / f"{s}.scontrol") for s in states])
    log = tmp_path / "log.out"
    log.write_text("step 1\n")
    assert follow("122", log, poll_s=0) == "COMPLETED"
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "[wait] job 122: PENDING",
        "step 1",
        "[wait] job 122: RUNNING",
        "[wait] job 122: COMPLETED",
    ]
    assert fake.calls("scontrol") == [["show", "job", "-o", "122"]] * 5
    assert fake.calls("sacct") == []


def test_follow_reads_accounting_once_slurmctld_forgot_the_job_and_goes_on_after_a_failed_query(fake, tmp_path, capsys):
    fake.answer(
        "scontrol", (0, RECORDED / "running.scontrol"), (1, "slurm_load_jobs error: Invalid job id specified\n")
    )
    fake.answer(
        "sacct",
        (1, "sacct: error: Problem talking to the database: Connection refused\n"),
        (0, RECORDED / "failed.sacct"),
    )
    assert follow("125", tmp_path / "absent.log", poll_s=0) == "FAILED"
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["[wait] job 125: RUNNING", "[wait] job 125: FAILED"]
    assert captured.err.splitlines() == [
        "[wait] job 125: sacct failed: sacct: error: Problem talking to the database: Connection refused"
    ]
    assert [c[c.index("-j") :] for c in fake.calls("sacct")] == [["-j", "125"]] * 2


def test_follow_ends_early_when_the_deadline_says_so(fake, tmp_path):
    fake.answer("scontrol", (0, RECORDED / "pending.scontrol"), (0, RECORDED / "running.scontrol"))
    seen = []

    def deadline(state, started):
        seen.append((state, started is None))
        return len(seen) == 3

    state = follow("123", tmp_path / "absent.log", poll_s=0, deadline=deadline)
    assert state == "RUNNING" and seen == [("PENDING", True), ("RUNNING", False), ("RUNNING", False)]


def test_slurm_is_asked_only_once_the_script_leaves_the_dry_run(fake, tmp_path, monkeypatch, capsys):
    """A dry run sets no SLURM_CONF, runs no Slurm client and writes nothing; --emit points the clients at the profile's
    slurm.conf and looks up the --after job before writing; a submission also looks for a live job of the name and
    claims the job's directories."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=fake\n")  # no SlurmctldHost: no controller to probe
    site = yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text())
    site["submission"]["slurm_conf"] = str(conf)
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    monkeypatch.delenv("SLURM_CONF")
    work = tmp_path / "work"
    argv = ["--site", str(tmp_path / "site.yaml"), "--nodes", "1", "--job-name", "chained", "--after", "122"]

    def run(*flags: str) -> str:
        code, out, err = main([*argv, *flags], capsys)
        assert code == 0, err
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
    assert json.loads((work / "checkpoints" / "chained" / OWNER_FILE).read_text()) == {"job_name": "chained"}


def test_a_live_job_of_the_name_is_refused_before_sbatch(fake, tmp_path, capsys):
    recorded = (RECORDED / "running.squeue").read_text()  # one RUNNING job, its name made this job's
    fake.answer("squeue", (0, recorded.replace(recorded.split("\x1f")[1], "chained")))
    code, _, err = main(["--site", "local", "--nodes", "1", "--job-name", "chained"], capsys)
    assert code == 2 and err.splitlines() == [
        "hpc.submit: error: --job-name 'chained': job 123 of that name is RUNNING; two jobs of one name would share "
        "one run: wait for it, cancel it, or pick another name"
    ], err
    assert fake.calls("sbatch") == [] and not (tmp_path / "work" / "jobs").exists()
