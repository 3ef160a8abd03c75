"""python -m hpc.node.health as the nodes run it, asking the nvidia-smi on PATH: the local cluster's test fake
(scripts/fake_nvidia_smi.sh, a recorded `nvidia-smi -q`) is read as the driver's answer; none, or one that fails, on
a GPU partition is a failed node."""

import os
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

RECORDINGS = ROOT / "tests" / "unit" / "data" / "nvidia-smi"


def health(tmp_path: Path, gpus: int, smi: str | None = None, **env: str):
    """The command on node gpu07 with ``smi`` (a script's text) as nvidia-smi, else the fake; none with ``smi=""``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is None:
        (bin_dir / "nvidia-smi").symlink_to(ROOT / "scripts" / "fake_nvidia_smi.sh")
    elif smi:
        (bin_dir / "nvidia-smi").write_text(smi)
        (bin_dir / "nvidia-smi").chmod(0o755)
    path = f"{bin_dir}:" + ":".join(d for d in os.environ["PATH"].split(":") if not (Path(d) / "nvidia-smi").exists())
    env = {"PATH": path, "SLURMD_NODENAME": "gpu07", "FAKE_NVIDIA_SMI_RECORDINGS": str(RECORDINGS), **env}
    return run_cli("-m", "hpc.node.health", "--gpus", str(gpus), cwd=tmp_path, env=env, timeout=120)


@pytest.mark.parametrize("node_gpus, gpus", [(8, 8), (2, 2), (8, 2)])
def test_the_fakes_recording_is_checked_as_the_drivers_answer(tmp_path, node_gpus, gpus):
    r = health(tmp_path, gpus, FAKE_NVIDIA_SMI_GPUS=str(node_gpus))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"[health] gpu07 node: ok: {node_gpus} GPU(s) seen by nvidia-smi; the partition has {gpus}" in r.stdout
    assert r.stdout.count("NVIDIA H100 80GB HBM3: no ECC, retirement, remapping, clock or power problem") == node_gpus
    assert r.stdout.rstrip().endswith("[health] gpu07: healthy")


def test_the_fakes_faulty_recording_fails_the_node(tmp_path):
    r = health(tmp_path, 8, FAKE_NVIDIA_SMI_GPUS="8", FAKE_NVIDIA_SMI_FAULTY_IF='[ "$SLURMD_NODENAME" = gpu07 ]')
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[health] gpu07 gpu 5 (00000000:AB:00.0): FAIL: a row remapping is pending (needs a GPU reset)" in r.stdout
    assert r.stdout.rstrip().endswith("[health] gpu07: FAILED 5 check(s); exclude it with --exclude gpu07")


def test_a_node_fewer_gpus_than_the_partition_fails(tmp_path):
    r = health(tmp_path, 8, FAKE_NVIDIA_SMI_GPUS="2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[health] gpu07 node: FAIL: 2 GPU(s) seen by nvidia-smi; the partition has 8" in r.stdout


@pytest.mark.parametrize(
    "smi, why",
    [
        ("", "nvidia-smi is not on PATH (no NVIDIA driver)"),
        (
            "#!/bin/sh\n"
            'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\n'
            "exit 9\n",
            "nvidia-smi -q failed with exit code 9: NVIDIA-SMI has failed because it couldn't communicate with the "
            "NVIDIA driver.",
        ),
    ],
)
def test_a_gpu_partitions_node_without_a_working_nvidia_smi_fails(tmp_path, smi, why):
    r = health(tmp_path, 2, smi)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"[health] gpu07 node: FAIL: {why}: the partition has 2 GPU(s) per node, none checked" in r.stdout
    assert r.stdout.rstrip().endswith("[health] gpu07: FAILED 1 check(s); exclude it with --exclude gpu07")


def test_a_cpu_partitions_node_needs_no_nvidia_smi(tmp_path):
    r = health(tmp_path, 0, "")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[health] gpu07 node: ok: the partition has no GPUs: nvidia-smi not asked" in r.stdout
