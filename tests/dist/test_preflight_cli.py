"""hpc.login.preflight's bad input: one line, exit 2, before anything is submitted."""

import pytest

from conftest import run_cli


@pytest.mark.parametrize("args,message", [
    (["--nodes", "5"], "--nodes 5: partition debug of site local has at most 4 nodes"),
    (["--nodes", "1", "--min-fraction", "2"], "argument --min-fraction: 2 is out of range: allowed (0, 1]"),
    (["--nodes", "1", "--min-bytes", "4096", "--max-bytes", "1024"], "--min-bytes 4096 is larger than --max-bytes 1024"),
])
def test_bad_input_exits_2_before_submitting(tmp_path, args, message):
    r = run_cli("-m", "hpc.login.preflight", "--site", "local", *args, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "jobs").exists()
