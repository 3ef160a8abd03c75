"""The bad-input survey (cases in bad_input_cases.py), in-process: each command's ``main(argv)`` in a fresh working
directory. An error case must exit 2 with exactly one stderr line, no traceback, naming its flag, file or key, every
echoed value capped, and leave the directory as it was (nothing created, written or renamed); nothing is submitted:
the unit tier refuses any process (tests/unit/conftest.py), so sbatch cannot be reached. Hostile-but-valid input
must exit 0 and, where a check is given, be carried exactly."""

from __future__ import annotations

import importlib
import os
import signal
from pathlib import Path

import pytest
from bad_input_cases import FIFO, Case, all_cases

from hpc.node.cli import LINE_CHARS

CASES = all_cases()
DROP_ENV = (
    "SLURM_",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HPC_",
    "NCCL_",
    "GLOO_",
    "GROUP_RANK",
    "NODE_RANK",
)
SIGNALS = (signal.SIGPIPE, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
MAX_LINE = len("python -m hpc.node.preflight_node: error: ") + LINE_CHARS + 40


def fill(text: str, tmp: Path) -> str:
    return text.replace("{T}", str(tmp))


def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size if not p.is_dir() else 0, st.st_mtime_ns)
    return out


def prepare(case: Case, tmp: Path, monkeypatch) -> None:
    """The case's files in ``tmp`` (its working directory) and its environment, without the job's or the node's."""
    (tmp / "home").mkdir()
    for rel, content in case.files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is FIFO:
            os.mkfifo(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(fill(content, tmp))
    for name in list(os.environ):
        if name.startswith(DROP_ENV):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp / "home"))
    monkeypatch.setenv("SLURM_CONF", str(tmp / "no-slurm.conf"))  # no profile's slurm.conf, no controller to reach
    for name, value in case.env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, fill(value, tmp))
    monkeypatch.chdir(tmp)


def call(case: Case, tmp: Path, capsys) -> tuple[int, str, str]:
    """The command's exit status, stdout and stderr."""
    module = importlib.import_module("train.__main__" if case.cli == "train" else case.cli)
    capsys.readouterr()
    try:
        rc = module.main([fill(a, tmp) for a in case.argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return 0 if rc is None else rc, out, err


@pytest.fixture
def restore_signals():
    """The commands set handlers (SIGPIPE default, the trainer's stop signals); the test process keeps its own."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, monkeypatch, capsys, restore_signals):
    tmp = tmp_path / "work"
    tmp.mkdir()
    prepare(case, tmp, monkeypatch)
    before = tree(tmp)
    rc, out, err = call(case, tmp, capsys)
    after = tree(tmp)
    assert "Traceback" not in err, err[-2000:]
    if case.expect == "ok":
        assert rc == 0, f"exit {rc}: {err[-1000:]}"
        problem = case.check(tmp, out) if case.check else None
        assert problem is None, problem
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, f"exit {rc}, expected 2: {err[-1000:]}"
    assert len(lines) == 1, f"{len(lines)} stderr lines, expected 1: {lines[:5]}"
    assert ": error: " in lines[0], lines[0]
    assert len(lines[0]) <= MAX_LINE, f"error line of {len(lines[0])} characters"
    if case.names:
        assert fill(case.names, tmp).lower() in lines[0].lower(), f"{case.names!r} not named in: {lines[0]}"
    created = sorted(set(after) - set(before))
    changed = sorted(k for k in set(after) & set(before) if after[k] != before[k])
    removed = sorted(set(before) - set(after))
    assert not (created or changed or removed), (
        f"left behind: created {created[:5]}, changed {changed[:5]}, removed {removed[:5]}"
    )


def test_survey_size():
    """The survey holds at least 2350 cases, most of them errors."""
    assert len(CASES) >= 2350
    assert sum(c.expect == "error" for c in CASES) >= 2300
