"""hpc/node/tool.py, the one runner of the tools the project asks: output bounded, a timeout, bytes that are not
UTF-8 replaced, a missing tool named (real processes: /bin/sh and python)."""

import sys
import time

import pytest

from hpc.node.tool import ToolMissing, ToolTimeout, run_tool


def test_output_is_bounded():
    r = run_tool([sys.executable, "-c", "import sys; sys.stdout.write('x' * 5_000_000)"], 60, limit=1000)
    assert r.returncode == 0 and r.stdout == "x" * 1000 and r.truncated


def test_not_utf8_is_replaced():
    r = run_tool(["/bin/sh", "-c", r"printf 'ok\377\376 done'; printf 'err\377' >&2; exit 3"], 30)
    assert r.returncode == 3 and r.stdout == "ok\ufffd\ufffd done" and r.stderr == "err\ufffd" and not r.truncated


def test_timeout_kills_the_tool():
    started = time.monotonic()
    with pytest.raises(ToolTimeout):
        run_tool(["/bin/sh", "-c", "sleep 30"], 1)
    assert time.monotonic() - started < 10


def test_missing_tool():
    with pytest.raises(ToolMissing):
        run_tool(["no-such-tool-anywhere"], 5)
