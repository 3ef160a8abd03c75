"""Who is missing at a hang: the arrival protocol on a real TCPStore, the line, and
the settings that lead to a node's exclusion (the trainer's straggler.stop_after, the profile's key for it)."""

import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from train_helpers import TINY, free_port

from hpc.node.hang import (
    flight_recorder_env,
    hang_line,
    mark_bad_nodes,
    missing_text,
    name_the_missing,
    post_arrival,
    ranks_text,
)
from hpc.site import load_site
from hpc.trainer_job import trainer_job
from train.front.config import ConfigError, load_config


def test_the_arrived_wait_the_grace_and_leave_early_once_all_posted():
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    t0 = time.monotonic()
    assert post_arrival(store, 0, 3, grace_s=1.0) == {0: "timeout"}  # nobody else came: the whole grace
    assert post_arrival(store, 2, 3, "peer ended", grace_s=1.0) == {0: "timeout", 2: "peer ended"}
    assert 2.0 <= time.monotonic() - t0 < 3.5
    t0 = time.monotonic()
    assert post_arrival(store, 1, 3, grace_s=30.0) == {
        0: "timeout",
        1: "timeout",
        2: "peer ended",
    }  # all posted: no wait
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("others, marked", [("timeout", True), ("peer ended", False)])
def test_a_timeout_of_any_rank_that_arrived_makes_it_a_hang(tmp_path, monkeypatch, capsys, others, marked):
    """Rank 0 saw "connection closed" (rank 1, giving up on the stopped rank 2 first, tore its connections down):
    rank 1's timeout makes it a hang that marks rank 2's node; when every rank that arrived saw a peer end, it is a
    crash, named, with no node marked."""
    monkeypatch.setenv("HPC_BAD_NODE_MARKS", str(tmp_path / "marks"))
    store = dist.TCPStore(
        "127.0.0.1", free_port(), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    post_arrival(store, 1, 3, others, grace_s=0.0)
    arrived, missing, peer_ended = name_the_missing(
        "after step 7", 12.0, 0, ["n1", "n2", "n3"], "peer ended", store, grace_s=0.5
    )
    assert (arrived, missing, peer_ended) == ([0, 1], [2], not marked)
    line = capsys.readouterr().out.splitlines()[0]
    assert line == hang_line("after step 7", 12.0, [0, 1], ["n1", "n2", "n3"], peer_ended=not marked)
    assert (tmp_path / "marks" / "n3").exists() == marked


def test_the_line_names_the_missing_with_their_nodes():
    nodes = ["n1", "n1", "n2", "n2", "n3", "n3", "n3", "n3"]
    assert (
        ranks_text([3]) == "rank 3"
        and ranks_text([0, 1, 2]) == "ranks 0-2"
        and ranks_text([0, 2, 5, 6, 7]) == "ranks 0, 2, 5-7"
    )
    assert missing_text([2, 4, 5, 6, 7], nodes) == "rank 2 on n2, ranks 4-7 on n3"
    assert (
        hang_line("after step 42", 20.2, [0, 1, 2], nodes[:4])
        == "[hang] a collective timed out after step 42 (after 20 s): rank 3 on n2 did not arrive (ranks 0-2 did)"
    )
    assert hang_line("after step 42", 1.2, [0, 1, 2], nodes[:4], peer_ended=True) == (
        "[hang] a collective failed after "
        "step 42, a peer's process having ended (after 1 s): rank 3 on n2 did not arrive (ranks 0-2 did)"
    )
    env = {"MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    assert "the rendezvous store at n1:29500 did not answer either" in hang_line("after step 1", 10, None, nodes, env)


def test_marks_and_flight_recorder_paths(tmp_path):
    assert mark_bad_nodes(["n2"], {}) is None
    marks = mark_bad_nodes(["n2", "n3"], {"HPC_BAD_NODE_MARKS": str(tmp_path / "marks")})
    assert sorted(p.name for p in marks.iterdir()) == ["n2", "n3"]
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}
    assert flight_recorder_env(env, tmp_path / "log") == tmp_path / "log" / "nccl-trace"
    assert env == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "100",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "log" / "nccl-trace" / "rank-"),
    }


def test_straggler_exclusion_settings(tmp_path):
    assert load_config(str(TINY), []).straggler.stop_after == 0
    with pytest.raises(
        ConfigError, match=r"straggler.stop_after=2 .*preemption.exclude_stragglers_after.* below straggler.windows=3"
    ):
        load_config(str(TINY), ["straggler.stop_after=2"])
    site = load_site("local")
    assert not any(a.startswith("straggler.stop_after=") for a in trainer_job([], site, tmp_path, tmp_path).args())
    site = site.model_copy(update={"preemption": site.preemption.model_copy(update={"exclude_stragglers_after": 4})})
    assert trainer_job([], site, tmp_path, tmp_path).args()[-1] == "straggler.stop_after=4"
    assert trainer_job(["straggler.stop_after=0"], site, tmp_path, tmp_path).args().count("straggler.stop_after=0") == 1
