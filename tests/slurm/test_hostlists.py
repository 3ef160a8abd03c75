"""Node lists as Slurm writes them, expanded by the nodes' parser (hpc.node.slurm_env.node_hosts, python-hostlist)
and by Slurm itself (`scontrol show hostnames` of the local cluster): zero padding, several ranges, several bracket
groups, mixed lists; the master address, the first node as Slurm orders them, is the same in every case."""

import random
import subprocess

import pytest

from hpc.node.slurm_env import derive, node_hosts

pytestmark = pytest.mark.slurm
# the strings peers' users hit: zero padding kept (b04-010 is wrong), mixed bracket lists, an unsorted list
KNOWN = [
    "b04-[09-10]",
    "node[1-2],gpu[01-02]",
    "gpu-a[001-003],gpu-b7",
    "n[001-003,010]",
    "n[9-11]",
    "n[2-3],n1",
    "rack[1-2]-n[01-02]",
    "c[01-02]-[1-2]",
    "n01-[7-9]x[1,3]",
    "a[0-1]b[0-1]c[0-1]",
    "host",
]


def scontrol_hostnames(text: str) -> list[str]:
    r = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, (text, r.stderr)
    return r.stdout.split()


def generated(rng: random.Random) -> str:
    """A node list in Slurm's forms: prefixes with digits and dashes, zero-padded ranges and single numbers, one or two
    bracket groups, several comma-separated entries."""

    def group() -> str:
        width = rng.choice([1, 2, 3, 4])
        parts = []
        for _ in range(rng.randint(1, 3)):
            lo = rng.randint(0, 10**width // 2)
            hi = lo + rng.randint(0, 12)
            parts.append(f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}")
        return "[" + ",".join(parts) + "]"

    def prefix() -> str:
        return rng.choice(["n", "gpu", "b04-", "node-a", "x1c0s", "r0"])

    entries = []
    for _ in range(rng.randint(1, 3)):
        entry = prefix() + group()
        if rng.random() < 0.3:
            entry += rng.choice(["-", "s", "n"]) + group()
        entries.append(entry)
    return ",".join(entries)


# three bracket groups: Slurm orders the nodes its own way (a0b0c0, a0b0c1, a1b0c0, ...); the first node, the count
# and the set agree, which is what the rank wiring reads (the master address, the node count; SLURM_NODEID is Slurm's)
THREE_GROUPS = {"a[0-1]b[0-1]c[0-1]"}


def test_known_strings_expand_as_slurm_expands_them(slurm):
    for text in KNOWN:
        mine, slurms = node_hosts(text), scontrol_hostnames(text)
        assert mine[0] == slurms[0] and sorted(mine) == sorted(slurms), text
        assert text in THREE_GROUPS or mine == slurms, text
        n = len(slurms)
        env = {
            "SLURM_JOB_ID": "7",
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": str(n),
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_JOB_NUM_NODES": str(n),
            "SLURM_JOB_NODELIST": text,
            "SLURM_TASKS_PER_NODE": f"1(x{n})",
        }
        assert derive(env).master_addr == slurms[0], text  # every rank's MASTER_ADDR: node 0 as Slurm names it


def test_generated_lists_expand_as_slurm_expands_them(slurm):
    rng = random.Random(20261206)
    for _ in range(150):
        text = generated(rng)
        slurms = scontrol_hostnames(text)
        if len(set(slurms)) != len(slurms):
            continue  # overlapping ranges: Slurm lists a node twice, a job's node list never does
        assert node_hosts(text) == slurms, text
