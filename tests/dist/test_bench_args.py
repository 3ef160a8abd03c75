"""bench/train_bench.py as a process: a bad --cases is one line and exit 2 before any GPU work, without a traceback (the
other bad arguments are checked in process: tests/unit/test_bench_args.py)."""

from conftest import run_cli


def test_a_bad_bench_argument_is_one_line():
    proc = run_cli("bench/train_bench.py", "--cases", "1.7B", timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--cases '1.7B': must be SHAPE:VARIANT" in last, last
