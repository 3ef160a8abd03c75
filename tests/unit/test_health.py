"""hpc.node.health on recorded `nvidia-smi -q` outputs (tests/unit/data/nvidia-smi/): healthy and faulty GPUs; a node of
a GPU partition without nvidia-smi's answer fails, one of a CPU partition is not asked for it. The command itself with
the test fake of nvidia-smi on PATH: tests/dist/test_health_cli.py."""

from pathlib import Path

import pytest

from hpc.node.health import NoSmi, check_smi, judge, main, node_findings, parse_smi_q, smi_findings

DATA = Path(__file__).parent / "data" / "nvidia-smi"


def failures(name: str, gpus: int) -> list[tuple[str, str]]:
    return [(f.where, f.text) for f in check_smi((DATA / name).read_text(), gpus) if not f.ok]


def test_healthy_h100_node_passes():
    found = check_smi((DATA / "h100-healthy.txt").read_text(), 8)
    assert len(found) == 9 and all(f.ok for f in found)
    gpus = parse_smi_q((DATA / "h100-healthy.txt").read_text())
    assert [g["Minor Number"] for g in gpus] == [str(i) for i in range(8)]
    assert gpus[3]["GPU Power Readings"]["Default Power Limit"] == "700.00 W"


def test_faulty_h100_node_names_the_gpus_and_faults():
    assert failures("h100-faulty.txt", 8) == [
        ("gpu 2 (00000000:3A:00.0)", "clocks held down: HW Slowdown, HW Thermal Slowdown active"),
        ("gpu 2 (00000000:3A:00.0)", "application graphics clock 1410 MHz is below the default 1755 MHz"),
        ("gpu 2 (00000000:3A:00.0)", "power capped at 400 W, below the default 700 W"),
        ("gpu 5 (00000000:AB:00.0)", "2 uncorrectable ECC error(s) since the last reset (DRAM Uncorrectable 2)"),
        ("gpu 5 (00000000:AB:00.0)", "a row remapping is pending (needs a GPU reset)"),
    ]


def test_missing_gpu_and_older_driver_format():
    assert failures("h100-gpu-missing.txt", 8) == [("node", "7 GPU(s) seen by nvidia-smi; the partition has 8")]
    assert failures("h100-gpu-missing.txt", 4) == []  # a partition of 4-GPU nodes
    assert failures("a100-faulty-r470.txt", 2) == [  # driver 470: Single/Double Bit sections, "Clocks Throttle Reasons"
        ("gpu 1 (00000000:0F:00.0)", "1 uncorrectable ECC error(s) since the last reset (Double Bit / Total 1)"),
        ("gpu 1 (00000000:0F:00.0)", "a row remapping is pending (needs a GPU reset)"),
        ("gpu 1 (00000000:0F:00.0)", "row remapping failed: the memory cannot be repaired"),
    ]


def test_page_pending_retirement_fails():
    text = (
        (DATA / "h100-healthy.txt")
        .read_text()
        .replace("Pending Page Blacklist            : N/A", "Pending Page Blacklist            : Yes", 1)
    )
    assert failures_of(text) == [("gpu 0 (00000000:18:00.0)", "a page is pending retirement (needs a GPU reset)")]


def failures_of(text: str) -> list[tuple[str, str]]:
    return [(f.where, f.text) for f in check_smi(text, 8) if not f.ok]


def test_rates_are_judged_against_the_profile():
    assert judge("gpu 0", "bf16 matmul", 700, "TFLOP/s", 800, 0.8).ok
    slow = judge("gpu 1", "bf16 matmul", 500, "TFLOP/s", 800, 0.8)
    assert not slow.ok and slow.text == "bf16 matmul 500 TFLOP/s, 62% of the expected 800 (below 0.8 x)"
    assert judge("gpu 0", "HBM copy", 1.0, "GB/s", None, 0.8).ok


@pytest.mark.parametrize(
    "why",
    [
        "nvidia-smi is not on PATH (no NVIDIA driver)",
        "nvidia-smi -q failed with exit code 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        "driver.",
    ],
)
def test_a_gpu_partitions_node_without_nvidia_smi_fails(why):
    found = node_findings(2, None, None, 0.8, smi=lambda: NoSmi(why))
    assert (found[0].where, found[0].ok) == ("node", False)
    assert found[0].text == f"{why}: the partition has 2 GPU(s) per node, none checked"
    assert [f.ok for f in found[1:]] == [True] and "TFLOP/s" in found[1].text  # the CPU's rates, reported


def test_a_cpu_partition_asks_no_nvidia_smi():
    def asked():
        raise AssertionError("nvidia-smi asked on a CPU partition")

    [f] = smi_findings(0, asked)
    assert f.ok and f.text == "the partition has no GPUs: nvidia-smi not asked"


def test_nvidia_smis_answer_is_checked():
    text = (DATA / "h100-faulty.txt").read_text()
    assert smi_findings(8, lambda: text) == check_smi(text, 8)


def test_command_on_a_cpu_partition_is_healthy_without_nvidia_smi(monkeypatch, capsys):
    monkeypatch.setenv("SLURMD_NODENAME", "cpu03")
    assert main(["--gpus", "0"]) == 0
    out = capsys.readouterr().out
    assert "[health] cpu03 node: ok: the partition has no GPUs: nvidia-smi not asked" in out
    assert out.rstrip().endswith("[health] cpu03: healthy")
