"""hpc.plan as a process: a bad command line is one line, exit 2, no traceback (the planner, its command line and
hpc.submit's use of it are tested in process: tests/unit/test_plan.py)."""

from conftest import run_cli


def test_a_cli_error_is_one_line_exit_2():
    """The process's side of the contract; the messages are checked in process (tests/bad_input_cases.py)."""
    r = run_cli("-m", "hpc.plan", "--site", "ib-h200", "--nodes", "2", "--model", "9B", timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("hpc.plan: error: --model 9B: allowed"), r.stderr
