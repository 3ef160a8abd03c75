"""Whatever Slurm answers is one line: damaged, truncated, other-format answers, garbage numbers and hostile records
are either read into sane fields or named in one JobError line; `(null)` never reaches what is shown; terminal control
codes are escaped. The answers are hand-made from tests/unit/data/slurm's recordings' fields."""

import json
import os

import pytest

from hpc.node.cli import error_line, printable
from hpc.node.restart import read_log, restart_lines
from hpc.slurm_query import SACCT_FIELDS, SEP, JobError, expand_indices, job_from, parse_sacct, parse_scontrol

GOOD = {
    "JobIDRaw": "12",
    "JobName": "train",
    "State": "COMPLETED",
    "NNodes": "2",
    "Elapsed": "00:01:00",
    "Partition": "debug",
    "NodeList": "n[1-2]",
    "WorkDir": "/tmp",
    "SubmitLine": "sbatch job.sbatch",
    "JobID": "12",
}
CTL = "JobId=12 JobName=train JobState=RUNNING NumNodes=2 Partition=debug NodeList=n[1-2] Restarts=0 StdOut=/j/12.out"


def sacct_line(**changes) -> str:
    return SEP.join({**GOOD, **changes}[f] for f in SACCT_FIELDS)


def job_of(ctl: str = "", sacct: str = ""):
    return job_from("12", parse_scontrol(ctl) if ctl else {}, parse_sacct(sacct))


SACCT = {  # sacct's answer: what job_from makes of it must be sane, or a JobError
    "truncated": SEP.join(list(GOOD.values())[:4]),
    "extra-field": sacct_line() + SEP + "x",
    "json": json.dumps({"jobs": [GOOD]}),
    "nnodes-abc": sacct_line(NNodes="abc"),
    "nnodes-neg": sacct_line(NNodes="-1"),
    "nnodes-huge": sacct_line(NNodes="9" * 30),
    "nnodes-replaced": sacct_line(NNodes="2\ufffd"),
    "nnodes-unicode": sacct_line(NNodes="\u0663"),
    "partition-null": sacct_line(Partition="(null)"),
    "nodelist-null": sacct_line(NodeList="(null)"),
    "nodelist-none": sacct_line(NodeList="None assigned"),
}
SCONTROL = {
    "numnodes-abc": CTL.replace("NumNodes=2", "NumNodes=abc"),
    "numnodes-huge": CTL.replace("NumNodes=2", "NumNodes=" + "9" * 30),
    "restarts-x": CTL.replace("Restarts=0", "Restarts=x"),
    "restarts-neg": CTL.replace("Restarts=0", "Restarts=-1"),
    "restarts-huge": CTL.replace("Restarts=0", "Restarts=99999999999"),
    "not-pairs": "slurm_load_jobs error: Unexpected message received",
    "stdout-null": CTL.replace("StdOut=/j/12.out", "StdOut=(null)"),
    "exclude-null": CTL + " ExcNodeList=(null)",
    "reason-none": CTL + " Reason=None",
    "nodelist-null": CTL.replace("NodeList=n[1-2]", "NodeList=(null)"),
    "partition-null": CTL.replace("Partition=debug", "Partition=(null)"),
}
ARRAYS = {
    "past-max": "0-4000001",
    "huge": "0-99999999",
    "letters": "abc",
    "mixed": "[0-3,x]",
    "neg": "-1-3",
    "eight-digits": "12345678",
}


def sane(job) -> None:
    for field in ("name", "state", "partition", "nodelist", "reason", "excluded"):
        assert "(null)" not in getattr(job, field), (field, getattr(job, field))
    assert 0 <= job.nodes < 2**32 and 0 <= job.restarts < 2**32
    assert job.job_dir is None or "(null)" not in str(job.job_dir)


def one_line(e: JobError) -> None:
    line = error_line("hpc.jobs", e)
    assert "\n" not in line and "\x1b" not in line and len(line) < 1100


@pytest.mark.parametrize("answer", SACCT.values(), ids=SACCT.keys())
def test_sacct_answer(answer):
    try:
        sane(job_of(sacct=answer))
    except JobError as e:
        one_line(e)


@pytest.mark.parametrize("answer", SCONTROL.values(), ids=SCONTROL.keys())
def test_scontrol_answer(answer):
    try:
        sane(job_of(ctl=answer))
    except JobError as e:
        one_line(e)


@pytest.mark.parametrize("text", ARRAYS.values(), ids=ARRAYS.keys())
def test_array_answer_bounded(text):
    with pytest.raises(JobError) as e:
        expand_indices(text)
    one_line(e.value)


def test_array_answer_at_the_bound():
    assert len(expand_indices("[0-3,5]")) == 5
    assert expand_indices("4000000") == [4000000]


HOSTILE = {
    "what-osc": {"what": "\x1b]0;owned\x07died"},
    "why-csi": {"action": "end", "why": "\x1b[2J\x1b[Hcleared"},
    "nodes-c1": {"nodes": ["n1\x9b31m"], "replaced": {"n1\x1b": "n2"}},
}
BROKEN = {
    "restart-text": {"restart": "x"},
    "attempt-list": {"attempt": [1]},
    "fault-at-text": {"fault_at": "x", "trained_at": 5.0},
    "nodes-number": {"nodes": 3},
    "replaced-list": {"replaced": ["n1"]},
    "id-number": {"id": 7},
}


def record(**changes) -> dict:
    return {"id": "12-0-0", "job_id": "12", "restart": 0, "attempt": 0, "action": "restart", "what": "died", **changes}


@pytest.mark.parametrize("changes", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_record_shown_escaped(changes, tmp_path):
    log = tmp_path / "restarts.jsonl"
    log.write_text(json.dumps(record(**changes)) + "\n")
    shown = printable("\n".join(restart_lines(read_log(log, "12"))))
    assert shown and "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown


@pytest.mark.parametrize("changes", BROKEN.values(), ids=BROKEN.keys())
def test_broken_record_left_out(changes, tmp_path):
    log = tmp_path / "restarts.jsonl"
    log.write_text(json.dumps(record(**changes)) + "\n" + json.dumps(record(id="12-0-1")) + "\n")
    decisions = read_log(log, "12")
    assert [d["id"] for d in decisions] == ["12-0-1"]
    restart_lines(decisions)


def test_restart_records_not_utf8_nor_regular(tmp_path):
    log = tmp_path / "restarts.jsonl"
    log.write_bytes(b"\xff\xfe garbage\n" + json.dumps(record()).encode() + b"\n")
    assert [d["id"] for d in read_log(log, "12")] == ["12-0-0"]
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert read_log(fifo, "12") == []  # not opened: a FIFO would block
