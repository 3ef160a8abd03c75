"""hpc.preflight's bad input: one line, exit 2, before anything is submitted."""

from conftest import run_cli


def test_bad_input_exits_2_before_submitting(tmp_path):
    """The process's side of the contract; the messages are checked in process (tests/bad_input_cases.py)."""
    r = run_cli("-m", "hpc.preflight", "--site", "local", "--nodes", "5", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--nodes 5: partition debug of site local has at most 4 nodes" in r.stderr
    assert not (tmp_path / "jobs").exists()
