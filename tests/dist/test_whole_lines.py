"""Processes that share a stream (the ranks of a node) never split each other's lines, unbuffered as Slurm jobs and CI
run them: each line of `whole_lines`'s print, and each `print_error`, is one write."""

import os
import subprocess
import sys

from conftest import ROOT

WRITER = """
import sys
from hpc.node.cli import print_error, whole_lines
if sys.argv[1] == "whole":
    whole_lines()
for i in range(20000):
    print(f"rank {sys.argv[2]} line {i} " + "x" * 100, flush=True)
    print_error("train", f"rank {sys.argv[2]} error {i}")
"""


def shared_stream(mode: str) -> list[str]:
    """The lines of two writers started together on one pipe (stdout and stderr both), unbuffered."""
    env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    read, write = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, mode, str(r)], stdout=write, stderr=write, env=env)
        for r in (0, 1)
    ]
    os.close(write)
    with open(read) as stream:
        lines = stream.read().splitlines()
    assert all(p.wait(timeout=60) == 0 for p in procs)
    return lines


def test_two_writers_lines_stay_whole():
    lines = shared_stream("whole")
    assert len(lines) == 80000
    for r in (0, 1):
        ours = [line for line in lines if line.startswith(f"rank {r} ") or line.startswith(f"train: error: rank {r} ")]
        assert len(ours) == 40000
    assert all(
        line == f"rank {line.split()[1]} line {line.split()[3]} " + "x" * 100
        or line == f"train: error: rank {line.split()[3]} error {line.split()[5]}"
        for line in lines
    )
