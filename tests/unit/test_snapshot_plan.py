"""Memory snapshots' pure part (train/snapshot_plan.py and the layout rule in train/front/run_check.py): the partner
map, the job's directory, the resume's choice between a snapshot and the disk checkpoint, checkpoint.memory_every's
refusals."""

from __future__ import annotations

import pytest
from train_helpers import TINY

from hpc.node.contract import SNAPSHOT_DIR_VAR
from hpc.node.snapshot_dir import job_dir, job_key
from train.front.config import ConfigError, load_config
from train.front.layout import WorldEnv
from train.front.run_check import check_run, snapshot_problem
from train.snapshot_plan import Choice, Found, choose, partners, sender_of

TWO_BY_TWO = ["n1", "n1", "n2", "n2"]


def test_each_rank_s_partner_is_the_same_local_rank_on_the_next_node():
    assert partners(TWO_BY_TWO) == [2, 3, 0, 1]
    assert partners(["a", "a", "b", "b", "c", "c"]) == [2, 3, 4, 5, 0, 1]
    assert partners(["b", "a"]) == [1, 0]  # the nodes in the order their ranks come
    assert [sender_of(partners(["a", "b", "c"]), r) for r in range(3)] == [2, 0, 1]


@pytest.mark.parametrize("nodes", [["a", "a"], ["a", "a", "b"], []])
def test_partners_need_two_nodes_with_as_many_ranks_each(nodes):
    with pytest.raises(ValueError, match="2 or more nodes with the same number of ranks"):
        partners(nodes)


def test_the_snapshots_live_under_the_job_id_and_its_run():
    env = {"SLURM_JOB_ID": "77", SNAPSHOT_DIR_VAR: "/x"}
    assert job_key(env) == "77.0" and str(job_dir(env)) == "/x/77.0"
    assert job_key({**env, "SLURM_RESTART_COUNT": "2"}) == "77.2"  # a requeue: another run, never the old copies
    assert job_key({**env, "SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "3"}) == "5_3.0"
    assert str(job_dir({"SLURM_JOB_ID": "77"})) == "/dev/shm/hpc-snapshots/77.0"
    for bad in ({}, {"SLURM_JOB_ID": "../x"}, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1/.."}):
        assert job_key(bad) is None and job_dir(bad) is None


def found(node: str, files: dict[int, list[int]], complete: list[int]) -> Found:
    return Found(node, files, complete)


def test_a_lost_node_s_ranks_resume_from_their_partner_copies():
    both = {12: [0, 1, 2, 3]}
    lost = [found("n1", both, [12]), found("n1", both, [12]), found("n3", {}, []), found("n3", {}, [])]
    choice = choose(lost, disk_step=10)
    assert choice == Choice(12, [0, 0, 0, 0])
    assert choice.transfers(["n1", "n1", "n3", "n3"]) == [(0, 2), (0, 3)]


def test_a_rank_reads_its_own_node_first():
    everywhere = {8: [0, 1, 2, 3]}
    f = [found(n, everywhere, [8]) for n in TWO_BY_TWO]
    choice = choose(f, disk_step=None)
    assert choice == Choice(8, [0, 0, 2, 2]) and choice.transfers(TWO_BY_TWO) == []


def test_the_disk_checkpoint_wins_when_it_is_as_new_or_newer():
    f = [found(n, {10: [0, 1, 2, 3]}, [10]) for n in TWO_BY_TWO]
    assert choose(f, disk_step=10) is None and choose(f, disk_step=15) is None
    assert choose(f, disk_step=9).step == 10


def test_a_snapshot_without_a_marker_or_missing_a_rank_s_state_is_not_used():
    unmarked = [found(n, {12: [0, 1, 2, 3]}, []) for n in TWO_BY_TWO]
    assert choose(unmarked, disk_step=None) is None
    # step 14 lost rank 3's state with both of its copies (two nodes' memory); step 12 is whole
    f = [
        found("n1", {12: [0, 1, 2, 3], 14: [0, 1, 2]}, [12, 14]),
        found("n1", {12: [0, 1, 2, 3], 14: [0, 1, 2]}, [12, 14]),
        found("n3", {}, []),
        found("n3", {}, []),
    ]
    assert choose(f, disk_step=10).step == 12
    assert choose(f, disk_step=12) is None


def test_memory_every_needs_ranks_on_two_or_more_nodes_with_as_many_each():
    assert snapshot_problem(0, 1, 1) is None and snapshot_problem(2, 4, 2) is None
    assert snapshot_problem(2, 4, 4) == (
        "checkpoint.memory_every=2: needs ranks on 2 or more nodes (each node's copy goes to the next node); all 4 "
        "rank(s) run on one node: set checkpoint.memory_every=0"
    )
    assert snapshot_problem(3, 6, 4).startswith("checkpoint.memory_every=3: needs the same number of ranks on every")
    cfg = load_config(str(TINY), ["checkpoint.memory_every=2"])
    with pytest.raises(ConfigError, match="checkpoint.memory_every=2: needs ranks on 2 or more nodes"):
        check_run(cfg, WorldEnv(0, 0, 2, 2))
    check_run(cfg, WorldEnv(0, 0, 2, 1))


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_memory_every_must_be_a_whole_number_of_at_least_0(value):
    with pytest.raises(ConfigError, match="checkpoint.memory_every") as e:
        load_config(str(TINY), [f"checkpoint.memory_every={value}"])
    assert "\n" not in str(e.value)
