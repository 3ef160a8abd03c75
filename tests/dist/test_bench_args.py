"""bench/train_bench.py's command line: bad --cases and --set are one line and exit 2 before any GPU work."""
import pytest

from conftest import run_cli


@pytest.mark.parametrize("args, says", [
    (["--cases", "1.7B:ours", "9B:ours"], "--cases '9B:ours': must be SHAPE:VARIANT"),
    (["--cases", "1.7B"], "--cases '1.7B': must be SHAPE:VARIANT"),
    (["--set", "compile=maybe"], "--set compile: Input should be a valid boolean"),
    (["--set", "no_such_key=1"], "--set no_such_key: Extra inputs are not permitted"),
    (["--set", "master_dtype"], "--set: override 'master_dtype': expected key.sub=value"),
])
def test_bad_bench_arguments_are_one_line(args, says):
    proc = run_cli("bench/train_bench.py", *args, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert says in last, last
