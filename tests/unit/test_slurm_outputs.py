"""hpc.slurm_query's parsers over squeue, sacct and scontrol outputs recorded from the local cluster
(scripts/record_slurm_outputs.py records them into data/slurm, with what each job was made to be)."""

import json
from pathlib import Path

import pytest

from hpc.node.contract import ENDED_STATES
from hpc.slurm_query import SACCT_FIELDS, SQUEUE_FIELDS, job_from, parse_sacct, parse_scontrol, parse_squeue, restarts

DATA = Path(__file__).parent / "data" / "slurm"
CASES = json.loads((DATA / "cases.json").read_text())
ENDED_CASES = sorted(c for c, w in CASES.items() if w["state"] in ENDED_STATES)
LIVE_CASES = sorted(c for c, w in CASES.items() if w["state"] not in ENDED_STATES)


def recorded(case: str, kind: str) -> str:
    return (DATA / f"{case}.{kind}").read_text()


def test_every_state_was_recorded():
    assert {c["state"] for c in CASES.values()} >= {"PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
    assert any(c["restarts"] >= 2 for c in CASES.values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_scontrol_fields(case):
    want, ctl = CASES[case], parse_scontrol(recorded(case, "scontrol"))
    assert (ctl["JobId"], ctl["JobName"], ctl["JobState"]) == (want["job_id"], want["name"], want["state"])
    assert int(ctl["Restarts"]) == want["restarts"]
    assert ctl["NumNodes"].split("-")[0] == str(want["nodes"])  # "1-1" (min-max) while pending
    assert ctl["StdOut"].endswith(f"/{want['job_id']}.out")
    if "exit_code" in want:
        assert ctl["ExitCode"] == want["exit_code"]


@pytest.mark.parametrize("case", ENDED_CASES)
def test_sacct_runs_and_restarts(case):
    want, rows = CASES[case], parse_sacct(recorded(case, "sacct"))
    assert rows and all(list(r) == list(SACCT_FIELDS) for r in rows)
    assert {(r["JobIDRaw"], r["JobName"], r["NNodes"]) for r in rows} == {
        (want["job_id"], want["name"], str(want["nodes"]))
    }
    assert restarts(rows) == want["restarts"]
    assert rows[-1]["State"].split()[0] == want["state"]  # "CANCELLED by 0"
    assert rows[-1]["SubmitLine"].startswith("sbatch ") and rows[-1]["NodeList"].startswith("n")


@pytest.mark.parametrize("case", LIVE_CASES)
def test_squeue_rows_of_live_jobs(case):
    want, rows = CASES[case], parse_squeue(recorded(case, "squeue"))
    assert [(r["JobIDRaw"], r["JobName"], r["State"], r["NNodes"]) for r in rows] == [
        (want["job_id"], want["name"], want["state"], str(want["nodes"]))
    ]
    assert list(rows[0]) == list(SQUEUE_FIELDS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_job_from_slurmctld_and_from_accounting_alone(case):
    """What hpc.jobs shows: slurmctld's view while it remembers the job, accounting's after (no batch script to
    read)."""
    want = CASES[case]
    ctl, rows = parse_scontrol(recorded(case, "scontrol")), parse_sacct(recorded(case, "sacct"))
    job = job_from(want["job_id"], ctl, rows)
    assert (job.name, job.state, job.nodes, job.restarts) == (
        want["name"],
        want["state"],
        want["nodes"],
        want["restarts"],
    )
    assert job.finished == (want["state"] in ENDED_STATES) and job.job_dir == Path(ctl["StdOut"]).parent
    if want["state"] not in ENDED_STATES:
        return  # slurmctld remembers a live job; accounting may not have it yet, or only as an "allocation"
    forgotten = job_from(want["job_id"], {}, rows)
    assert (forgotten.name, forgotten.nodes, forgotten.restarts) == (want["name"], want["nodes"], want["restarts"])
    assert forgotten.stdout is None  # a --wrap job names no script
    assert forgotten.state.split()[0] == want["state"] and forgotten.finished
