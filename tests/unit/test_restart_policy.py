"""The in-job restart's decision table (hpc/node/restart_policy.py): what ended an attempt, judged from the records its
tasks and ranks left, and what follows; the next attempt's nodes; the records themselves (hpc/node/attempt.py)."""

import json
from collections import Counter

import pytest

from hpc.node import attempt
from hpc.node.attempt import Progress, Records, read, record_collective, record_exit, record_start
from hpc.node.restart import read_log, timing_line
from hpc.node.restart_policy import (
    Action,
    Failure,
    History,
    Kind,
    Limits,
    decide,
    decisive,
    judge,
    left_the_job,
    place,
)

NODES = ["n1", "n1", "n2", "n2"]  # rank -> node: 2 nodes x 2 ranks


def starts() -> list[dict]:
    return [{"rank": r, "node": n, "pid": 100 + r} for r, n in enumerate(NODES)]


def exit_(rank: int, rc: int, at: float, signal: str | None = None) -> dict:
    return {
        "who": f"rank {rank} on {NODES[rank]}",
        "rank": rank,
        "task": rank,
        "node": NODES[rank],
        "rc": rc,
        "signal": signal,
        "at": at,
    }


def note(rank: int, failure: str, missing: list[int], failed_at: float, arrived=(), step: int = 12) -> dict:
    arrived = [r for r in range(4) if r not in missing] if arrived == () else arrived
    return {
        "rank": rank,
        "node": NODES[rank],
        "failure": failure,
        "step": step,
        "failed_at": failed_at,
        "step_started_at": failed_at - 15,
        "arrived": arrived,
        "missing": missing,
        "missing_nodes": sorted({NODES[r] for r in missing}),
        "nodes": NODES,
        "at": failed_at + 5,
    }


def records(exits=(), notes=(), marked=(), progress=None) -> Records:
    return Records(starts=starts(), exits=list(exits), notes=list(notes), marked=list(marked), progress=progress or {})


def test_every_rank_done_and_a_clean_stop():
    assert judge(records([exit_(r, 0, 10) for r in range(4)]), stopped=False, rc=0, world=4).kind == Kind.DONE
    stop = judge(records([exit_(r, 75, 10) for r in range(4)]), stopped=True, rc=0, world=4)
    assert stop.kind == Kind.STOPPED and stop.nodes == ()


def test_a_persistent_stragglers_stop_names_its_node():
    f = judge(records([exit_(r, 75, 10) for r in range(4)], marked=["n2"], progress={"step_at": 9.0}), True, 0, 4)
    assert (f.kind, f.nodes, f.at) == (Kind.STRAGGLER, ("n2",), 9.0)


@pytest.mark.parametrize("rc,kind", [(2, Kind.BAD_INPUT), (93, Kind.NO_RESTART)])
def test_bad_input_and_no_restart_win_over_what_followed(rc, kind):
    f = judge(records([exit_(1, rc, 10), exit_(2, 0, 9), exit_(3, 137, 12, "SIGKILL")]), False, None, 4)
    assert (f.kind, f.nodes, f.rc) == (kind, ("n1",), rc)


def test_a_ranks_own_error_is_not_restarted_though_the_others_collectives_failed_after_it():
    """Rank 1 raised (exit 1) and closed its connections; ranks 0, 2, 3 saw their peer's process end, named it missing
    and exited 1 themselves: the first failure, rank 1's, has no collective note of its own."""
    rs = records(
        [exit_(1, 1, 10.5)] + [exit_(r, 1, 15.2) for r in (0, 2, 3)],
        [note(r, "peer ended", [1], 10.1) for r in (0, 2, 3)],
    )
    f = judge(rs, False, 1, 4)
    assert (f.kind, f.nodes, f.rc) == (Kind.ERROR, ("n1",), 1) and "rank 1 on n1 ended with exit code 1" in f.what


def test_a_killed_process_names_its_node():
    rs = records([exit_(2, 139, 10.0, "SIGSEGV")], [note(r, "peer ended", [2], 10.01) for r in (0, 1, 3)])
    f = judge(rs, False, None, 4)
    assert (f.kind, f.nodes, f.at, f.rc) == (Kind.DIED, ("n2",), 10.0, 139) and "killed by SIGSEGV" in f.what


def test_a_timeout_names_the_missing_ranks_node_and_the_fault_at_the_steps_start():
    rs = records(
        [exit_(r, 1, 40.5) for r in (0, 1, 3)], [note(r, "timeout", [2], 40.0) for r in (0, 1, 3)], marked=["n2"]
    )
    f = judge(rs, False, None, 4)
    assert (f.kind, f.nodes, f.at, f.seen) == (Kind.HANG, ("n2",), 25.0, 40.0)
    assert f.what == "a collective timed out after step 12: rank 2 on n2 did not arrive"


def test_a_timeout_seen_as_a_closed_connection_by_some_ranks_is_a_timeout():
    rs = records(
        notes=[note(0, "timeout", [2], 40.0), note(1, "peer ended", [2], 40.2), note(3, "peer ended", [2], 40.1)]
    )
    assert judge(rs, False, None, 4).kind == Kind.HANG


def test_a_timeout_whose_store_did_not_answer_names_the_rank_that_said_nothing():
    rs = records(notes=[note(r, "timeout", [], 40.0, arrived=None) for r in (1, 2, 3)])
    assert (judge(rs, False, None, 4).kind, judge(rs, False, None, 4).nodes) == (Kind.HANG, ("n1",))


def test_a_nodes_ranks_gone_without_records_name_the_node():
    rs = records([exit_(r, 1, 16) for r in (0, 1)], [note(r, "peer ended", [2, 3], 10.0) for r in (0, 1)])
    f = judge(rs, False, None, 4)
    assert (f.kind, f.nodes) == (Kind.VANISHED, ("n2",)) and f.what.startswith("ranks 2, 3 on n2 ended after step 12")


def test_a_rank_slower_to_fail_beside_an_answering_rank_of_its_node_is_not_gone():
    # n2's processes killed at once; rank 0 saw the connections close and named ranks 1-3 missing, since rank 1 (on
    # n1, alive) had not failed yet: only n2 vanished, and the records do not decide until rank 1 is heard from
    early = records(notes=[note(0, "peer ended", [1, 2, 3], 10.0)])
    assert not decisive(early, 4)
    assert (judge(early, False, None, 4).kind, judge(early, False, None, 4).nodes) == (Kind.VANISHED, ("n2",))
    late = records(notes=[note(0, "peer ended", [1, 2, 3], 10.0), note(1, "peer ended", [2, 3], 12.0)])
    assert decisive(late, 4)
    assert judge(late, False, None, 4).nodes == ("n2",)


def test_a_failure_that_names_nobody_is_unknown():
    f = judge(records(), False, 1, 4)
    assert (f.kind, f.nodes, f.rc) == (Kind.UNKNOWN, (), 1)


def test_when_the_records_suffice_to_end_the_step():
    assert decisive(records([exit_(2, 137, 10, "SIGKILL")]), 4)
    assert decisive(records([exit_(1, 1, 10)]), 4)  # an error of the program
    assert not decisive(records([exit_(0, 1, 10)], [note(0, "timeout", [2], 9)]), 4)  # a victim; ranks 1, 3 unaccounted
    assert decisive(records([exit_(0, 1, 10)], [note(r, "timeout", [2], 9) for r in (0, 1, 3)]), 4)
    assert not decisive(records([exit_(r, 0, 10) for r in range(3)]), 4)


LIMITS = Limits(max_restarts=3, max_restarts_per_node=1)
ALL = {"n1", "n2", "n3"}


def died(node: str = "n2") -> Failure:
    return Failure(Kind.DIED, (node,), f"rank 2 on {node} was killed by SIGKILL", 10.0, 137, 10.0)


@pytest.mark.parametrize("kind", [Kind.BAD_INPUT, Kind.NO_RESTART, Kind.ERROR])
def test_the_programs_own_failures_end_the_job(kind):
    assert decide(Failure(kind, ("n1",), "", 1.0, 1), History(), LIMITS, ALL, 2).action == Action.END


def test_a_named_node_leaves_and_the_ranks_restart_while_a_spare_is_left():
    d = decide(died(), History(), LIMITS, ALL, 2)
    assert (d.action, d.out) == (Action.RESTART, ("n2",))
    d = decide(died(), History(restarts=1, caused=Counter(n1=1)), LIMITS, {"n2", "n3"}, 2)
    assert (d.action, d.out) == (Action.REQUEUE, ("n2",)) and "1 healthy node(s) left, the ranks need 2" in d.why


def test_a_node_stays_until_it_caused_max_restarts_per_node():
    limits = Limits(max_restarts=5, max_restarts_per_node=2)
    assert decide(died(), History(), limits, ALL, 2).out == ()
    assert decide(died(), History(restarts=1, caused=Counter(n2=1)), limits, ALL, 2).out == ("n2",)


def test_the_restart_limit_falls_back_to_the_requeue():
    d = decide(died(), History(restarts=3), LIMITS, ALL, 2)
    assert d.action == Action.REQUEUE and "restarted 3 time(s), at most 3" in d.why


def test_an_unknown_failure_restarts_once_per_job():
    f = Failure(Kind.UNKNOWN, (), "", None, 1)
    assert decide(f, History(), LIMITS, ALL, 2).action == Action.RESTART
    assert decide(f, History(restarts=1, unattributed=1), LIMITS, ALL, 2).action == Action.END


def test_done_and_stopped():
    assert decide(Failure(Kind.DONE), History(), LIMITS, ALL, 2).action == "done"
    assert decide(Failure(Kind.STOPPED), History(), LIMITS, ALL, 2).action == "stop"


def test_a_node_slurm_took_out_of_the_job_vanished_whatever_its_killed_step_left():
    """A node set DOWN under --no-kill: Slurm kills the ranks' step (here srun's exit alone: unknown, which would
    restart on the same nodes, the gone one among them), and the node is named instead; a later second time too."""
    unknown = judge(records(), False, 1, 4)
    f = left_the_job(unknown, ["n3"], 20.0)
    assert (f.kind, f.nodes, f.at, f.seen, f.rc) == (Kind.VANISHED, ("n3",), 20.0, 20.0, 1)
    assert "n3 left the job's allocation" in f.what
    d = decide(f, History(restarts=1, unattributed=1), Limits(3, 10), {"n1", "n2"}, 2)
    assert d.action == Action.RESTART  # the gone node is no longer usable: the two others take the ranks
    killed = left_the_job(died("n1"), ["n3"], 20.0)
    assert (killed.kind, killed.nodes, killed.at) == (Kind.VANISHED, ("n3",), 10.0)
    assert decide(left_the_job(died("n1"), ["n3"], 20.0), History(), LIMITS, {"n1"}, 2).action == Action.REQUEUE
    for end in (Failure(Kind.DONE), Failure(Kind.STOPPED)):
        assert left_the_job(end, ["n3"], 20.0) is end
    assert left_the_job(unknown, [], 20.0) is unknown


def test_history_counts_restarts_by_cause_and_node():
    h = History.of(
        [
            {"action": Action.RESTART, "kind": Kind.DIED, "nodes": ["n2"]},
            {"action": Action.RESTART, "kind": Kind.UNKNOWN, "nodes": []},
            {"action": Action.REQUEUE, "kind": Kind.HANG, "nodes": ["n3"]},
        ]
    )
    assert (h.restarts, h.unattributed, h.caused) == (2, 1, Counter(n2=1))


def test_the_next_attempt_keeps_its_nodes_and_takes_a_spare_for_the_named_one():
    alloc = ["n1", "n2", "n3", "n4"]
    assert place(alloc, [], set(), set(), Counter(), 2) == ["n1", "n2"]
    assert place(alloc, ["n1", "n3"], {"n2"}, {"n3"}, Counter(n2=1, n3=1), 2) == ["n1", "n4"]
    # a spare that never failed first, then the one that caused fewest restarts, the named ones last
    assert place(alloc, ["n1", "n2"], set(), {"n1"}, Counter(n1=1, n3=2, n4=1), 2) == ["n2", "n4"]
    assert place(alloc, ["n1", "n2"], {"n3", "n4"}, {"n2"}, Counter(n2=1), 2) == ["n1", "n2"]  # no other left
    assert place(alloc, ["n1", "n2"], {"n2", "n3", "n4"}, set(), Counter(), 2) is None


def test_the_records_of_an_attempt(tmp_path, monkeypatch):
    env = {"HPC_ATTEMPT_DIR": str(tmp_path), "RANK": "2", "SLURM_PROCID": "2", "SLURM_STEP_ID": "4"}
    (tmp_path / attempt.MARKS).mkdir()
    (tmp_path / attempt.MARKS / "n2").touch()
    record_start(env, "rank 2 on n2", "n2", 1234, rank_level=True)
    record_exit(env, "rank 2 on n2", "n2", -9, rank_level=True)
    record_exit({**env, "RANK": "1"}, "rank 1 on n1", "n1", 75, rank_level=True)
    monkeypatch.setenv("HPC_ATTEMPT_DIR", str(tmp_path))
    record_collective(0, "n1", "timeout", 12, 100.0, 15.0, [0, 1, 3], [2], NODES)
    p = Progress(0, env)
    p.loading()
    p.loaded(10)
    p.stepped(11)
    p.stepped(12)
    Progress(1, env).stepped(99)  # only rank 0 writes
    r = read(tmp_path)
    assert [(s["rank"], s["pid"], s["step"]) for s in r.starts] == [(2, 1234, "4")]
    assert sorted((e["rank"], e["rc"], e["signal"]) for e in r.exits) == [(1, 75, None), (2, 137, "SIGKILL")]
    assert r.notes[0]["step_started_at"] == 85.0 and r.notes[0]["missing_nodes"] == ["n2"]
    assert r.marked == ["n2"]
    assert (
        r.progress["resumed_step"] == 10
        and r.progress["step"] == 12
        and r.progress["trained_at"] <= r.progress["step_at"]
    )
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_outside_a_job_with_spares_nothing_is_written(tmp_path):
    record_exit({}, "rank 0", "n1", 1, rank_level=True)
    Progress(0, {}).stepped(1)
    assert attempt.attempt_dir({}) is None


def test_the_restart_log_merges_a_decision_with_its_completion(tmp_path):
    log = tmp_path / "restarts.jsonl"
    lines = [
        {
            "id": "7-0-0",
            "job_id": "7",
            "action": Action.RESTART,
            "kind": Kind.DIED,
            "step": 14,
            "fault_at": 100.0,
            "seen_at": 100.5,
            "ended_at": 101.0,
        },
        {"id": "9-0-0", "job_id": "9", "action": Action.END},
        {
            "id": "7-0-0",
            "job_id": "7",
            "load_started_at": 120.0,
            "loaded_at": 122.0,
            "resumed_step": 10,
            "trained_at": 123.0,
        },
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines) + "{not json\n")
    (rec,) = read_log(log, "7")
    assert rec["trained_at"] == 123.0 and rec["kind"] == Kind.DIED
    assert timing_line(rec) == (
        "training again from step 10 (4 step(s) lost), 23.0 s after the failure (detection 0.5 s, "
        "teardown 0.5 s, restart 19.0 s, load 2.0 s, first step 1.0 s)"
    )


ECC = "torch.AcceleratorError cudaErrorECCUncorrectable"


def test_a_suspected_node_fault_is_judged_from_its_exit_94_and_record():
    """Rank 2 raised an ECC error (exit 94, its record); the others saw its process end and exited 1 after it."""
    fault = {"rank": 2, "node": "n2", "signature": ECC, "what": "uncorrectable ECC error", "cause": "node"}
    rs = records(
        [exit_(2, 94, 10.2)] + [exit_(r, 1, 15.0) for r in (0, 1, 3)],
        [note(r, "peer ended", [2], 10.3) for r in (0, 1, 3)],
    )
    rs.faults = [fault]
    f = judge(rs, False, None, 4)
    assert (f.kind, f.nodes, f.rc, f.signature) == (Kind.NODE_FAULT, ("n2",), 94, ECC), f
    assert f"rank 2 on n2 ended on a suspected node fault: {ECC} (uncorrectable ECC error)" == f.what
    assert decisive(records([exit_(2, 94, 10.2)]), 4)


def node_fault(node: str, confirmed) -> Failure:
    return Failure(Kind.NODE_FAULT, (node,), "", 10.0, 94, 10.0, ECC, confirmed)


def test_a_node_fault_blames_the_node_only_when_its_gpu_checks_fail():
    d = decide(node_fault("n2", True), History(), LIMITS, ALL, 2)
    assert (d.action, d.out) == (Action.RESTART, ("n2",)) and "GPUs failed their checks" in d.why
    d = decide(node_fault("n2", False), History(), LIMITS, ALL, 2)
    assert (d.action, d.out) == (Action.RESTART, ()) and "not counted against it" in d.why
    h = History.of(
        [{"action": Action.RESTART, "kind": Kind.NODE_FAULT, "nodes": ["n2"], "signature": ECC, "confirmed": False}]
    )
    assert (h.restarts, h.caused) == (1, Counter())  # not blamed
    h = History.of(
        [{"action": Action.RESTART, "kind": Kind.NODE_FAULT, "nodes": ["n2"], "signature": ECC, "confirmed": True}]
    )
    assert h.caused == Counter(n2=1)


def test_the_same_error_back_on_another_node_is_the_programs_and_ends_the_job():
    h = History.of(
        [{"action": Action.RESTART, "kind": Kind.NODE_FAULT, "nodes": ["n2"], "signature": ECC, "confirmed": False}]
    )
    d = decide(node_fault("n3", None), h, LIMITS, ALL, 2)
    assert (
        d.action == Action.END
        and f"the same error ({ECC}) came back on n3 after it restarted the ranks off n2" in d.why
    )
    assert decide(node_fault("n2", False), h, LIMITS, ALL, 2).action == Action.RESTART  # the same node: not "another"
    other = Failure(Kind.NODE_FAULT, ("n3",), "", 10.0, 94, 10.0, "torch.distributed.DistBackendError ncclSystemError")
    assert decide(other, h, LIMITS, ALL, 2).action == Action.RESTART  # another error


def test_a_per_node_launchers_failure_with_a_ranks_node_fault_record_is_a_node_fault():
    """torchrun exits 1 whatever its rank's code; the rank's record says it was a suspected node fault."""
    task = {"who": "task 1 on n2", "rank": None, "task": 1, "node": "n2", "rc": 1, "signal": None, "at": 10.0}
    rs = records([task])
    assert judge(rs, False, None, 4).kind == Kind.ERROR
    rs.faults = [{"rank": 3, "node": "n2", "signature": ECC, "cause": "node"}]
    f = judge(rs, False, None, 4)
    assert (f.kind, f.nodes, f.signature) == (Kind.NODE_FAULT, ("n2",), ECC)
