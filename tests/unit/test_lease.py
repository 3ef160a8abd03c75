"""The checkpoint directory's lease: one holder at a time, taken over only from a holder that has surely ended."""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from hpc.node import lease
from hpc.node.contract import LEASE_FILE


def write_holder(directory, **record):
    (directory / LEASE_FILE).write_text(json.dumps({"run_id": "other", "job_name": "exp", "host": socket.gethostname(),
                                                    "started": time.time(), **record}))


def test_the_first_run_takes_it_and_releases_it(tmp_path):
    held, why = lease.take(tmp_path, "exp", {})
    assert why is None and json.loads((tmp_path / LEASE_FILE).read_text())["run_id"] == held.run_id
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEASE_FILE]  # no temporary file left
    held.release()
    assert not (tmp_path / LEASE_FILE).exists()


def test_a_live_holder_is_named_and_nothing_is_written(tmp_path):
    write_holder(tmp_path, pid=os.getpid(), job_id=None)  # this very process: alive
    before = (tmp_path / LEASE_FILE).read_text()
    with pytest.raises(lease.LeaseHeld, match=rf"checkpoint.dir {tmp_path} is in use by a run 'exp' on .* \(pid {os.getpid()},"):
        lease.take(tmp_path, "exp", {})
    assert (tmp_path / LEASE_FILE).read_text() == before and len(list(tmp_path.iterdir())) == 1


def test_a_holder_whose_process_has_exited_is_taken_over(tmp_path):
    write_holder(tmp_path, pid=2**22 + 12345, job_id=None)  # above pid_max's default: no such process
    held, why = lease.take(tmp_path, "exp", {})
    assert "has exited" in why and json.loads((tmp_path / LEASE_FILE).read_text())["run_id"] == held.run_id


def test_a_requeue_of_the_same_slurm_job_takes_it_over(tmp_path):
    write_holder(tmp_path, pid=1, job_id="4242")
    _, why = lease.take(tmp_path, "exp", {"SLURM_JOB_ID": "4242"})
    assert why == "the same Slurm job 4242 (requeued)"


def test_an_array_task_is_its_own_job(tmp_path):
    assert lease.slurm_job_id({"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "15", "SLURM_ARRAY_TASK_ID": "2"}) == "15_2"


def test_a_lease_not_refreshed_for_long_is_taken_over_and_a_fresh_one_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "_slurm_state", lambda job: None)  # Slurm cannot be asked (inside a container)
    write_holder(tmp_path, pid=1, job_id="77", host="elsewhere")
    with pytest.raises(lease.LeaseHeld, match="Slurm job 77 'exp' on elsewhere"):
        lease.take(tmp_path, "exp", {"SLURM_JOB_ID": "78"})
    old = time.time() - lease.STALE_S - 5
    os.utime(tmp_path / LEASE_FILE, (old, old))
    _, why = lease.take(tmp_path, "exp", {"SLURM_JOB_ID": "78"})
    assert why.startswith("not refreshed for")


def test_of_many_takers_of_an_ended_lease_exactly_one_wins(tmp_path):
    for round_ in range(20):  # one round rarely shows a race; twenty show it nearly always
        directory = tmp_path / str(round_)
        directory.mkdir()
        write_holder(directory, pid=2**22 + 12345, job_id=None)
        results, start = [], threading.Barrier(8)

        def taker():
            start.wait()
            try:
                results.append(lease.take(directory, "exp", {})[0].run_id)
            except lease.LeaseHeld:
                results.append(None)

        threads = [threading.Thread(target=taker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [r for r in results if r]
        assert len(winners) == 1 and json.loads((directory / LEASE_FILE).read_text())["run_id"] == winners[0]
        assert sorted(p.name for p in directory.iterdir()) == [LEASE_FILE, lease.TAKEOVER_LOCK]  # nothing else left


def test_a_take_over_never_moves_aside_a_lease_it_did_not_judge(tmp_path, monkeypatch):
    write_holder(tmp_path, pid=2**22 + 12345, job_id=None)
    real_holder = lease._holder

    def holder_replaced_after_judging(*args):  # the ended holder's lease gives way to a live run's right after the check
        seen = real_holder(*args)
        if seen and seen[0].get("run_id") == "other":
            write_holder(tmp_path, run_id="live", pid=os.getpid(), job_id=None)
        return seen

    monkeypatch.setattr(lease, "_holder", holder_replaced_after_judging)
    with pytest.raises(lease.LeaseHeld):
        lease.take(tmp_path, "exp", {})
    assert json.loads((tmp_path / LEASE_FILE).read_text())["run_id"] == "live"
