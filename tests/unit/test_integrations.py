"""The pieces of hpc.integrations and the notice that need no process: which checkpoint is complete, and a rank
program learning of a stop signal from hpc.node.launch's notice file."""
import json
import os
import signal

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
