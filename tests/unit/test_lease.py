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
    (directory / LEASE_FILE).write_text(
        json.dumps(
            {"run_id": "other", "job_name": "exp", "host": socket.gethostname(), "started": time.time(), **record}
        )
    )


def test_the_first_run_takes_it_and_releases_it(tmp_path):
    held, why = lease.take(tmp_path, "exp", {})
    assert why is None and json.loads((tmp_path / LEASE_FILE).read_text())["run_id"] == held.run_id
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEASE_FILE]  # no temporary file left
    held.release()
    assert not (tmp_path / LEASE_FILE).exists()


def test_a_live_holder_is_named_and_nothing_is_written(tmp_path):
    write_holder(tmp_path, pid=os.getpid(), job_id=None)  # this very process: alive
    before = (tmp_path / LEASE_FILE).read_text()
    with pytest.raises(
        lease.LeaseHeld, match=rf"checkpoint.dir {tmp_path} is in use by a run 'exp' on .* \(pid {os.getpid()},"
    ):
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

        def taker(start: threading.Barrier, directory, results: list) -> None:
            start.wait()
            try:
                results.append(lease.take(directory, "exp", {})[0].run_id)
            except lease.LeaseHeld:
                results.append(None)

        threads = [threading.Thread(target=taker, args=(start, directory, results)) for _ in range(8)]
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

    def holder_replaced_after_judging(
        *args,
    ):  # the ended holder's lease gives way to a live run's right after the check
        seen = real_holder(*args)
        if seen and seen[0].get("run_id") == "other":
            write_holder(tmp_path, run_id="live", pid=os.getpid(), job_id=None)
        return seen

    monkeypatch.setattr(lease, "_holder", holder_replaced_after_judging)
    with pytest.raises(lease.LeaseHeld):
        lease.take(tmp_path, "exp", {})
    assert json.loads((tmp_path / LEASE_FILE).read_text())["run_id"] == "live"


GARBAGE = {  # what is where the lease belongs -> what the one line says about it
    "not-json": (b"{holder", "not JSON"),
    "empty": (b"", "not JSON"),
    "array": (b"[1, 2]", "holds a JSON array, not an object"),
    "null": (b"null", "holds a JSON null, not an object"),
    "no-started": (
        json.dumps({"run_id": "a", "job_id": None, "job_name": "x", "host": "h", "pid": 5}).encode(),
        "started is missing",
    ),
    "started-1970": (
        json.dumps({"run_id": "a", "job_id": None, "job_name": "x", "host": "h", "pid": 5, "started": 0}).encode(),
        "started is 0, not a time since 2000",
    ),
    "started-text": (
        json.dumps({"run_id": "a", "job_id": None, "job_name": "x", "host": "h", "pid": 5, "started": "now"}).encode(),
        "started is 'now'",
    ),
    "started-nan": (
        b'{"run_id": "a", "job_id": null, "job_name": "x", "host": "h", "pid": 5, "started": NaN}',
        "started is nan",
    ),
    "started-huge": (
        b'{"run_id": "a", "job_id": null, "job_name": "x", "host": "h", "pid": 5, "started": 1e300}',
        "started is 1e+300",
    ),
    "pid-text": (
        json.dumps({"run_id": "a", "job_id": None, "job_name": "x", "host": "h", "pid": "5", "started": 2e9}).encode(),
        "pid is '5', not a process id",
    ),
    "job-id-list": (
        json.dumps({"run_id": "a", "job_id": [1], "job_name": "x", "host": "h", "pid": 5, "started": 2e9}).encode(),
        "job_id is [1], not a job id or null",
    ),
    "huge": (b" " * (lease.LEASE_BYTES + 1), "holds"),
    "binary": (b"\xff\xfe\x00", "not UTF-8"),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE) + ["directory", "fifo", "dangling-link"])
def test_a_file_that_is_no_lease_is_named_and_nothing_is_written(kind, tmp_path):
    path = tmp_path / LEASE_FILE
    if kind == "directory":
        path.mkdir()
        says = "a directory"
    elif kind == "fifo":
        os.mkfifo(path)
        says = "a FIFO"
    elif kind == "dangling-link":
        path.symlink_to(tmp_path / "nowhere")
        says = "a symbolic link to a missing file"
    else:
        data, says = GARBAGE[kind]
        path.write_bytes(data)
    before = sorted((p.name, p.lstat().st_mtime_ns) for p in tmp_path.iterdir()), tmp_path.stat().st_mtime_ns
    with pytest.raises(lease.NotALease) as e:
        lease.take(tmp_path, "exp", {})
    line = str(e.value)
    assert line.startswith(f"checkpoint.dir {tmp_path}: its {LEASE_FILE} is not a lease (") and says in line, line
    assert "since 19" not in line and "\n" not in line and len(line) < 600
    assert (sorted((p.name, p.lstat().st_mtime_ns) for p in tmp_path.iterdir()), tmp_path.stat().st_mtime_ns) == before


def test_a_live_holder_named_with_its_start_time(tmp_path):
    started = time.time() - 60
    write_holder(tmp_path, pid=os.getpid(), job_id=None, started=started)
    with pytest.raises(lease.LeaseHeld, match=time.strftime("since %Y-%m-%d %H:%M", time.localtime(started))):
        lease.take(tmp_path, "exp", {})
