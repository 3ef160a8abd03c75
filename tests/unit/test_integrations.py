"""The pieces of hpc.integrations and the notice that need no process: which checkpoint is complete, and a rank
program learning of a stop signal from hpc.node.launch's notice file."""

import json
import os
import signal
import time

import pytest

from hpc.integrations.checkpoints import mark_complete, newest_complete_checkpoint
from hpc.node.contract import CHECKPOINT_META, STOP_CAUGHT_SUFFIX, STOP_NOTICE_VAR, stop_signals
from hpc.node.launch import catches
from hpc.node.stop_flag import StopFlag


def test_newest_complete_checkpoint_skips_half_written_ones(tmp_path):
    assert newest_complete_checkpoint(tmp_path / "absent") is None
    for name in ("checkpoint-9", "checkpoint-10", "checkpoint-12", "checkpoint-x", "step-00000011.tmp"):
        (tmp_path / name).mkdir()
    assert newest_complete_checkpoint(tmp_path) is None  # no marker anywhere: a fresh start
    for name, step in (("checkpoint-9", 9), ("checkpoint-10", 10), ("step-00000011.tmp", 11)):
        mark_complete(tmp_path / name, step, 2)
    (tmp_path / "checkpoint-x" / CHECKPOINT_META).write_text("{}")
    # 12 has no marker (a save cut short), 11 is still .tmp, and 10 > 9 as numbers, not as names
    assert newest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert json.loads((tmp_path / "checkpoint-10" / CHECKPOINT_META).read_text()) == {"step": 10, "world_size": 2}
    assert sorted(p.name for p in (tmp_path / "checkpoint-10").iterdir()) == [CHECKPOINT_META]  # no temporary left


def test_accelerate_checkpoints_are_found_by_step(tmp_path):
    for step in (3, 20):
        (tmp_path / f"step-{step:08d}").mkdir()
        mark_complete(tmp_path / f"step-{step:08d}", step, 1, batches=step * 2)
    assert newest_complete_checkpoint(tmp_path) == str(tmp_path / "step-00000020")


@pytest.fixture
def restore_signals():
    saved = {sig: signal.getsignal(sig) for sig in stop_signals(os.environ)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_stop_flag_reads_the_notice_file_and_says_it_catches(tmp_path, restore_signals):
    notice = tmp_path / "notice"
    flag = StopFlag({STOP_NOTICE_VAR: str(notice)})
    assert (tmp_path / f"notice{STOP_CAUGHT_SUFFIX}").is_file()
    assert catches(os.getpid(), signal.SIGUSR2) and catches(os.getpid(), signal.SIGTERM)
    assert not flag.noticed() and not flag.agreed()
    notice.write_text("SIGUSR2")  # what hpc.node.launch leaves when the signal reached it before the program
    assert flag.agreed() and flag.received == "SIGUSR2"


def test_a_signal_left_at_its_default_is_not_caught(restore_signals):
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    assert not catches(os.getpid(), signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    assert not catches(os.getpid(), signal.SIGUSR2)


def _open_blocking_until(path, unblock_after_s: float) -> None:
    """Open FIFO ``path`` for reading (blocks until a writer comes); a watchdog opens it for writing after
    ``unblock_after_s`` so that a test of this never hangs."""
    import threading

    def writer():
        time.sleep(unblock_after_s)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # the reader is gone: nothing to unblock
            pass

    threading.Thread(target=writer, daemon=True).start()
    with open(path):
        pass


def test_sigterm_ends_a_start_blocked_in_a_system_call(tmp_path, restore_signals):
    """A program still starting (StopFlag(ends_start=True), not joined) that blocks in open() is ended by SIGTERM where
    it blocks (StopBeforeStart, exit 75), not kept alive by the stop handler retrying the call."""
    import threading

    from hpc.node.stop_flag import StopBeforeStart

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    flag = StopFlag({}, ends_start=True)
    main = threading.main_thread().ident
    threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGTERM)).start()
    start = time.monotonic()
    with pytest.raises(StopBeforeStart) as e:
        _open_blocking_until(fifo, unblock_after_s=10)
    assert time.monotonic() - start < 5 and e.value.code == 75 and flag.received == "SIGTERM"


def test_after_the_start_sigterm_is_a_stop_at_the_next_step(tmp_path, restore_signals):
    """Once the program can stop at a step boundary (joined), SIGTERM is recorded, as the pre-stop signal always is."""
    flag = StopFlag({}, ends_start=True)
    signal.raise_signal(signal.SIGUSR2)  # the pre-stop signal while starting: recorded only
    assert flag.received == "SIGUSR2"
    flag.join(None)
    signal.raise_signal(signal.SIGTERM)
    assert flag.noticed()


def test_a_notice_file_that_is_a_fifo_is_a_notice_and_blocks_nothing(tmp_path, restore_signals):
    notice = tmp_path / "notice"
    os.mkfifo(notice)
    flag = StopFlag({STOP_NOTICE_VAR: str(notice)})
    assert flag.noticed() and flag.received == "a stop notice"


@pytest.mark.parametrize(
    "marker, fine",
    [
        ({"step": 12, "world_size": 2}, True),
        ({"step": 11, "world_size": 2}, False),
        ({"step": 12}, False),
        ({"step": "12", "world_size": 2}, False),
        ([12], False),
        ("{not json", False),
        (None, False),
    ],
)
def test_a_damaged_marker_falls_back_to_the_older_complete_checkpoint(tmp_path, marker, fine):
    for step in (10, 12):
        (tmp_path / f"checkpoint-{step}").mkdir()
    mark_complete(tmp_path / "checkpoint-10", 10, 2)
    meta = tmp_path / "checkpoint-12" / CHECKPOINT_META
    if marker is None:
        os.mkfifo(meta)  # read without blocking: not a marker
    else:
        meta.write_text(marker if isinstance(marker, str) else json.dumps(marker))
    assert newest_complete_checkpoint(tmp_path) == str(tmp_path / ("checkpoint-12" if fine else "checkpoint-10"))


def test_mixed_checkpoint_formats_and_an_empty_path_are_refused(tmp_path, monkeypatch):
    from hpc.integrations.checkpoints import IntegrationError

    (tmp_path / "checkpoint-3").mkdir()
    mark_complete(tmp_path / "checkpoint-3", 3, 1)
    (tmp_path / "step-00000004").mkdir()
    mark_complete(tmp_path / "step-00000004", 4, 1)
    with pytest.raises(
        IntegrationError, match=r"holds complete checkpoints of both the Trainer \(checkpoint-N\) and accelerate"
    ):
        newest_complete_checkpoint(tmp_path)
    monkeypatch.chdir(tmp_path)  # a working directory full of checkpoints is never scanned for ""
    for empty in ("", " ", b"".decode()):
        with pytest.raises(IntegrationError, match="output_dir="):
            newest_complete_checkpoint(empty)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(IntegrationError, match="exists and is not a directory"):
        newest_complete_checkpoint(tmp_path / "afile")
