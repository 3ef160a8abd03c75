"""One GPU request per job (bad-input class 1), over the table of GPU forms: every form (``gres``, ``gpus``,
``gpus-per-node``, ``none``) with and without a GPU type, at several node, spare and per-node GPU counts. Each rendered
script is read back as Slurm would count it: the job's #SBATCH request and the health step over the whole allocation
ask for exactly the allocation's GPUs, the ranks' step never for more than the GPUs of its own nodes, every request
names the partition's type, and a CPU partition asks for none anywhere."""

from __future__ import annotations

import re

import pytest
import yaml

from hpc import submit as submit_cli

FORMS = [("gres", None), ("gres", "h100"), ("gpus", None), ("gpus", "h100"), ("gpus-per-node", None)]
FORMS += [("gpus-per-node", "h100"), ("none", None)]
COUNTS = [(1, 0, 8), (3, 0, 4), (2, 1, 8), (2, 2, 2), (1, 3, 8)]  # nodes, spares, --gpus-per-node
GPU_FLAGS = ("gres", "gpus", "gpus-per-node")


def site(tmp_path, form: str, kind: str | None) -> str:
    part = {"name": "p", "default": True, "max_nodes": 8, "gpus_per_node": 8, "cpus_per_node": 16, "gpu_request": form}
    if kind:
        part["gpu_type"] = kind
    data = {
        "name": "forms",
        "partitions": [part],
        "network": {"fabric": "ethernet", "nccl_socket_ifname": "eth0", "gloo_socket_ifname": "eth0"},
        "paths": {"job_dir": "./jobs", "checkpoint_root": "./checkpoints"},
    }
    path = tmp_path / "forms.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def requested(words: list[str], nodes: int) -> list[tuple[str | None, int]]:
    """The (type, total GPUs) each GPU option of one command asks for, over ``nodes`` nodes."""
    out = []
    for w in words:
        m = re.fullmatch(r"--(gres|gpus|gpus-per-node)=(.*)", w)
        if not m:
            continue
        flag, value = m.groups()
        *kind, count = value.removeprefix("gpu:").split(":") if flag == "gres" else value.split(":")
        total = int(count) if flag == "gpus" else int(count) * nodes
        out.append((kind[0] if kind else None, total))
    return out


def option(words: list[str], name: str) -> int:
    return int(next(w.split("=", 1)[1] for w in words if w.startswith(f"--{name}=")))


CASES = [(form, kind, *counts) for form, kind in FORMS for counts in COUNTS]


@pytest.mark.parametrize(
    "form, kind, nodes, spares, gpn", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}n{c[3]}s{c[4]}g" for c in CASES]
)
def test_the_job_and_each_step_ask_for_the_gpus_of_their_nodes(
    tmp_path, monkeypatch, capsys, form, kind, nodes, spares, gpn
):
    monkeypatch.setenv("USER", "alice")
    monkeypatch.chdir(tmp_path)
    argv = ["--site", site(tmp_path, form, kind), "--nodes", str(nodes), "--gpus-per-node", str(gpn), "--dry-run"]
    if spares:
        argv += ["--spare-nodes", str(spares)]
    with pytest.raises(SystemExit) as e:
        submit_cli.main(argv)
    script, err = capsys.readouterr()
    assert e.value.code == 0, err
    allocated = nodes + spares
    header = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH --")]
    assert option(header, "nodes") == allocated
    lines = script.replace("\\\n", " ").splitlines()  # continuation lines joined
    srun_lines = [line.split("srun ", 1)[1].split() for line in lines if re.search(r"(^|\s)srun ", line)]
    if form == "none":
        assert not requested(header, allocated) and not any(requested(w, allocated) for w in srun_lines), script
        return
    assert requested(header, allocated) == [(kind, allocated * gpn)], header
    for words in srun_lines:
        asked = requested(words, option(words, "nodes") if any(w.startswith("--nodes=") for w in words) else nodes)
        assert all(k == kind for k, _ in asked), words
        if any(w.startswith("--nodes=") for w in words):  # a step over the whole allocation (the health step)
            assert option(words, "nodes") == allocated and asked in ([], [(kind, allocated * gpn)]), words
        else:  # the ranks' step: at most its own nodes' GPUs (a spare's are the spare's)
            assert all(total <= nodes * gpn for _, total in asked), words
