"""Ranks' heartbeats and the phases' deadlines (hpc/node/heartbeat.py, hpc/node/hang_deadlines.py): who is hung, named
with its node, and who is only slow."""

import json
import time

from hpc.node.contract import ATTEMPT_DIR_VAR
from hpc.node.hang_deadlines import FROZEN_S, SAVE_MIN_S, STEP_MIN_S, deadline, hung, late
from hpc.node.heartbeat import EVAL, FIRST_STEP, SAVE, STEP, Heartbeat


def beat(rank: int, phase: str, step: int, since: float, alive: float, **more) -> dict:
    return {
        "rank": rank,
        "node": f"n{rank // 2 + 1}",
        "phase": phase,
        "step": step,
        "since": since,
        "alive": alive,
        "step_s": [],
        "save_s": 0.0,
        "eval_s": 0.0,
        **more,
    }


def test_a_ranks_beat_says_its_phase_and_what_it_measured(tmp_path):
    hb = Heartbeat(3, {ATTEMPT_DIR_VAR: str(tmp_path), "SLURMD_NODENAME": "n2"})
    try:
        first = json.loads((tmp_path / "beat-3.json").read_text())
        assert (first["rank"], first["node"], first["phase"]) == (3, "n2", FIRST_STEP)
        hb.enter(STEP, 2)
        time.sleep(0.05)
        hb.enter(STEP, 3)
        time.sleep(0.02)
        hb.enter(SAVE, 3)
        time.sleep(0.03)
        hb.enter(STEP, 4)
        data = json.loads((tmp_path / "beat-3.json").read_text())
        assert (data["phase"], data["step"]) == (STEP, 4)
        assert len(data["step_s"]) == 2 and 0.05 <= data["step_s"][0] < 1 and data["save_s"] >= 0.03
        alive = data["alive"]
        time.sleep(1.3)  # the thread beats on its own
        assert json.loads((tmp_path / "beat-3.json").read_text())["alive"] > alive
    finally:
        hb.close()
    assert Heartbeat(0, {}).path is None  # outside a job with spare nodes: nothing written


def test_each_phase_has_its_own_deadline_following_the_measured_times():
    assert deadline(beat(0, STEP, 5, 0, 0, step_s=[0.5, 0.6, 0.4])) == STEP_MIN_S  # 5 x 0.5 s is less
    assert deadline(beat(0, STEP, 5, 0, 0, step_s=[4.0, 6.0, 5.0])) == 25.0  # 5 x the median
    assert deadline(beat(0, SAVE, 5, 0, 0)) == SAVE_MIN_S > 90  # a save slowed to 90 s is no hang
    assert deadline(beat(0, SAVE, 5, 0, 0, save_s=100.0)) == 300.0
    assert deadline(beat(0, EVAL, 5, 0, 0)) >= 60 and deadline(beat(0, FIRST_STEP, 1, 0, 0)) >= 300


def test_a_stopped_process_is_named_with_its_node_and_a_slow_one_is_not():
    now = 1000.0
    steps = {"step_s": [1.0] * 5}
    ranks = [beat(r, STEP, 12, now - 2, now - 0.5, **steps) for r in range(4)]
    assert hung(ranks, set(), now) == []
    ranks[3] = beat(3, STEP, 12, now - 30, now - FROZEN_S - 1, **steps)  # SIGSTOPped 11 s ago
    (s,) = hung(ranks, set(), now)
    assert (s.rank, s.node, s.frozen) == (3, "n2", True) and "rank 3 on n2 silent 11 s in its step" in s.line(now)
    assert hung(ranks, {3}, now) == []  # it left an exit record: the records judge it


def test_ranks_past_their_deadline_are_said_not_named():
    """A rank stuck in a kernel and its peers waiting for it are all alive and late: no beat tells which is which."""
    now = 1000.0
    steps = {"step_s": [1.0] * 5}
    ranks = [beat(r, STEP, 13, now - 40, now - 0.5, **steps) for r in range(3)]
    ranks.append(beat(3, STEP, 12, now - 41, now - 0.5, **steps))
    assert hung(ranks, set(), now) == []
    assert [(s.rank, s.frozen, s.bound_s) for s in late(ranks, set(), now)] == [
        (r, False, STEP_MIN_S) for r in range(4)
    ]
    saving = [beat(r, SAVE, 10, now - 95, now - 0.5) for r in range(3)] + [beat(3, SAVE, 10, now - 95, now - 0.3)]
    assert late(saving, set(), now) == []  # a save slowed to 95 s
