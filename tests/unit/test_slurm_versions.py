"""hpc.slurm_query's parsers and hpc.jobs' causes over other Slurm versions' outputs (data/slurm/versions/README.md):
Slurm 24.11 and 26.05 run here from Debian's packages (text, with their --json as the independent oracle), and the
heterogeneous and array job ids of Slurm 23.11's and 25.05's documentation."""

import json
from pathlib import Path

import pytest

from hpc.job_outcome import outcome_lines
from hpc.node.contract import ENDED_STATES
from hpc.slurm_query import job_from, job_id_problem, job_sort_key, parse_sacct, parse_scontrol, parse_squeue

VERSIONS = Path(__file__).parent / "data" / "slurm" / "versions"
RECORDED = sorted(p.parent.name + "/" + p.name.removesuffix(".scontrol") for p in VERSIONS.glob("*/*.scontrol"))


def number(field: dict):
    """Slurm's JSON numbers since 23.11: {"set", "infinite", "number"} (None when not set)."""
    return field["number"] if field["set"] else None


def oracle_id(job: dict) -> str:
    """squeue's %i from the JSON record: 123, 123_4, or an array's pending tasks 123_[5-9%2]."""
    array = number(job["array_job_id"])
    if not array:
        return str(job["job_id"])
    task = number(job["array_task_id"])
    return f"{array}_{task}" if task is not None else f"{array}_[{job['array_task_string']}]"


@pytest.mark.parametrize("case", RECORDED)
def test_scontrol_text_agrees_with_its_json(case):
    text, doc = (
        (VERSIONS / f"{case}.scontrol").read_text(),
        json.loads((VERSIONS / f"{case}.scontrol.json").read_text()),
    )
    records = [parse_scontrol(line) for line in text.splitlines() if line.strip()]
    by_id = {str(j["job_id"]): j for j in doc["jobs"]}  # `scontrol --json show job 6_1` lists the whole array 6
    assert records and {r["JobId"] for r in records} <= set(by_id)
    assert len(records) == len(doc["jobs"]) or "_" in case.rsplit("/", 1)[1] and len(records) == 1
    for ctl, job in ((r, by_id[r["JobId"]]) for r in records):
        assert (ctl["JobId"], ctl["JobName"], ctl["JobState"]) == (str(job["job_id"]), job["name"], job["job_state"][0])
        out = job["standard_output"].replace("%j", str(job["job_id"]))  # 26.05's JSON keeps the --output pattern
        assert int(ctl["Restarts"]) == job["restart_cnt"] and ctl["StdOut"] == out
        assert ctl["NodeList"].replace("(null)", "") == job["nodes"]  # a pending job: "(null)" (24.11: empty)
        if number(job["array_job_id"]):
            task = number(job["array_task_id"])
            assert ctl["ArrayJobId"] == str(number(job["array_job_id"]))
            if task is not None:
                assert ctl["ArrayTaskId"] == str(task)
            else:  # the array's pending tasks: all of them ("2-3%1"), or the one asked for ("6_2" -> "2")
                assert ctl["ArrayTaskId"] == job["array_task_string"] or ctl["ArrayTaskId"] in job[
                    "array_task_string"
                ].split("%")[0].split("-")


@pytest.mark.parametrize(
    "case", [c for c in RECORDED if (VERSIONS / f"{c}.squeue.json").read_text().lstrip().startswith("{")]
)
def test_squeue_rows_agree_with_its_json(case):
    rows = parse_squeue((VERSIONS / f"{case}.squeue").read_text())
    jobs = json.loads((VERSIONS / f"{case}.squeue.json").read_text())["jobs"]
    want = sorted((oracle_id(j), j["name"], j["job_state"][0], str(number(j["node_count"]))) for j in jobs)
    assert sorted((r["JobIDRaw"], r["JobName"], r["State"], r["NNodes"]) for r in rows) == want
    assert all(job_sort_key(r["JobIDRaw"])[0] == 0 for r in rows)  # every id is a job, a task or an array's range


@pytest.mark.parametrize("case", [c for c in RECORDED if "array_whole" not in c])
def test_jobs_from_slurmctld_alone(case):
    """Without accounting (these clusters had none: sacct answers 'Slurm accounting storage is disabled', exit 1, as
    recorded), hpc.jobs reads slurmctld alone; the state and its cause follow Slurm's state word."""
    ctl = parse_scontrol((VERSIONS / f"{case}.scontrol").read_text())
    job = job_from(ctl["JobId"] if "ArrayTaskId" not in ctl else f"{ctl['ArrayJobId']}_{ctl['ArrayTaskId']}", ctl, [])
    word = ctl["JobState"]
    assert job.state == word and job.finished == (word in ENDED_STATES) and job.nodes >= 1
    causes = [line for line in outcome_lines(job) if line.startswith("cause: ")]
    expected = {
        "CANCELLED": "cause: cancelled (scancel)",
        "NODE_FAIL": "cause: a node of the job failed",
        "PREEMPTED": "cause: a higher-priority job preempted it",
        "TIMEOUT": "cause: it reached its time limit",
        "FAILED": "cause: the ranks or the batch script failed (exit code 3:0)",
    }.get(word)
    assert [c[: len(expected)] for c in causes] == ([expected] if expected else [])
    if word in ("NODE_FAIL", "TIMEOUT", "PREEMPTED", "CANCELLED"):
        assert any(
            line.startswith("next: ") and "resumes from its latest checkpoint" in line for line in outcome_lines(job)
        )
    if word == "NODE_FAIL":
        assert f"--exclude {ctl['NodeList']}" in " ".join(outcome_lines(job))


def test_sacct_without_accounting_is_recorded_as_slurm_says_it():
    for version in ("24.11", "26.05"):
        assert (VERSIONS / version / "running.sacct").read_text() == "Slurm accounting storage is disabled\n"


def doc_ids(name: str) -> list[str]:
    """The JOBID column of a documentation excerpt (its first line is the command, its second the header)."""
    lines = (VERSIONS / "docs" / name).read_text().splitlines()[2:]
    return [line.split()[0] for line in lines if line.strip() and not line.startswith("-")]


@pytest.mark.parametrize(
    "name,ids,listed",
    [
        (
            "23.11-job_array-squeue.txt",
            ["1080_[5-1024]", "1080_1", "1080_2", "1080_3", "1080_4"],
            ["1080_1", "1080_2", "1080_3", "1080_4", "1080_[5-1024]"],
        ),
        (
            "23.11-job_array-squeue-r.txt",
            ["1082_3", "1082_4", "1080", "1081", "1082_1", "1082_2"],
            ["1080", "1081", "1082_1", "1082_2", "1082_3", "1082_4"],
        ),
        ("25.05-heterogeneous_jobs-squeue.txt", ["93+0", "93+1", "93+2"], ["93+0", "93+1", "93+2"]),
        ("25.05-heterogeneous_jobs-sacct.txt", ["67767+0", "67767+1"], ["67767+0", "67767+1"]),
    ],
)
def test_documented_ids_are_jobs_tasks_and_components(name, ids, listed):
    got = doc_ids(name)
    assert got == ids and sorted(got, key=job_sort_key) == listed  # hpc.jobs list's order
    assert all(job_id_problem(i) is None for i in got if "[" not in i)  # hpc.jobs status takes each as an argument


def test_local_accounting_names_who_cancelled():
    """Accounting's 'CANCELLED by 0' (the local Slurm 22.05's record) names the user id; scontrol's word alone does
    not."""
    rows = parse_sacct((VERSIONS.parent / "cancelled.sacct").read_text())
    job = job_from(rows[-1]["JobIDRaw"], {}, rows)
    assert job.state.startswith("CANCELLED by ") and "cause: cancelled by user id 0 (scancel)" in outcome_lines(job)
