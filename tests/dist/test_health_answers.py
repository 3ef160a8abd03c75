"""Class 8 of the bad-input survey, generated (docs/bad-input.md): `python -m hpc.node.health --gpus 8` on a node whose
`nvidia-smi` (a script first on PATH, run as the check runs it) answers in every way a GPU node's driver can fail to
vouch for it, and with every field the check reads turned bad in the healthy H100 recording, one GPU at a time: the
node fails, and a line names the GPU and the field or what was missing. The same recording with fields that are no
fault (correctable errors, history, an idle GPU) passes, so the check cannot pass by failing everything."""

import os
import stat

import pytest
from conftest import ROOT

import hpc.node.health as health

DATA = ROOT / "tests" / "unit" / "data" / "nvidia-smi"
HEALTHY = (DATA / "h100-healthy.txt").read_text()
GPUS = 8


def set_field(text: str, gpu: int, section: tuple[str, ...], key: str, value: str) -> str:
    """``text`` with ``key`` under ``section`` of GPU ``gpu`` (its n-th ``GPU ...`` block) set to ``value``; sections
    are the lines without a ``:``, as `health.parse_smi_q` reads them."""
    lines, block, path, done = text.splitlines(keepends=True), -1, [], False
    for i, raw in enumerate(lines):
        line, indent = raw.strip(), len(raw) - len(raw.lstrip())
        if indent == 0:
            block += raw.startswith("GPU ")
            path = []
            continue
        if not line:
            continue
        depth = indent // 4 - 1
        if ":" not in line:
            path = path[:depth] + [line]
            continue
        name = line.partition(":")[0].strip()
        if block == gpu and tuple(path[: len(section)]) == section and name == key and not done:
            lines[i] = raw[: raw.index(":") + 1] + f" {value}\n"
            done = True
    assert done, (gpu, section, key)
    return "".join(lines)


# Every field the check reads, turned bad: (section, key, bad value, what the failed line says)
BAD_FIELDS = [
    (("ECC Errors", "Volatile"), "SRAM Uncorrectable Parity", "1", "1 uncorrectable ECC error(s)"),
    (("ECC Errors", "Volatile"), "SRAM Uncorrectable SEC-DED", "3", "3 uncorrectable ECC error(s)"),
    (("ECC Errors", "Volatile"), "DRAM Uncorrectable", "2", "2 uncorrectable ECC error(s)"),
    (("Retired Pages",), "Pending Page Blacklist", "Yes", "a page is pending retirement"),
    (("Remapped Rows",), "Pending", "Yes", "a row remapping is pending"),
    (("Remapped Rows",), "Remapping Failure Occurred", "Yes", "row remapping failed"),
    (("Clocks Event Reasons",), "HW Slowdown", "Active", "clocks held down: HW Slowdown active"),
    (("Clocks Event Reasons",), "HW Thermal Slowdown", "Active", "clocks held down: HW Thermal Slowdown active"),
    (("Clocks Event Reasons",), "HW Power Brake Slowdown", "Active", "HW Power Brake Slowdown active"),
    (("Clocks Event Reasons",), "SW Thermal Slowdown", "Active", "clocks held down: SW Thermal Slowdown active"),
    (("Applications Clocks",), "Graphics", "1410 MHz", "application graphics clock 1410 MHz is below"),
    (("Applications Clocks",), "Memory", "1593 MHz", "application memory clock 1593 MHz is below"),
    (("GPU Power Readings",), "Current Power Limit", "400.00 W", "power capped at 400 W"),
]
# Fields that change and are no fault
FINE_FIELDS = [
    (("ECC Errors", "Volatile"), "DRAM Correctable", "120"),
    (("ECC Errors", "Aggregate"), "DRAM Uncorrectable", "4"),  # since the GPU was made, not since its last reset
    (("Remapped Rows",), "Correctable Error", "3"),
    (("Clocks Event Reasons",), "SW Power Cap", "Active"),
]


def script(body: str) -> str:
    return "#!/bin/sh\n" + body + "\n"


def printing(text: str, code: int = 0) -> str:
    return script(f"cat <<'EOF'\n{text}EOF\nexit {code}")


# How the tool answers: (case, the file on PATH (None: absent; a str: an executable script; bytes: a non-executable
# file; "dir": a directory), what the node's failed line says)
ANSWERS = [
    ("not-on-path", None, "nvidia-smi is not on PATH (no NVIDIA driver)"),
    ("not-executable", HEALTHY.encode(), "nvidia-smi -q could not run (Permission denied)"),
    ("a-directory", "dir", "nvidia-smi -q could not run"),
    (
        "no-driver",
        script('echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9'),
        "nvidia-smi -q failed with exit code 9: NVIDIA-SMI has failed because it couldn't communicate",
    ),
    ("killed", script("kill -9 $$"), "nvidia-smi -q failed with exit code -9"),
    ("healthy-text-exit-1", printing(HEALTHY, 1), "nvidia-smi -q failed with exit code 1"),
    ("hangs", script("sleep 30"), "nvidia-smi -q did not answer within 1 s"),
    ("silent", script("exit 0"), "0 GPU(s) seen by nvidia-smi; the partition has 8"),
    ("not-utf8", script("printf '\\377\\376GPU \\200\\201\\n'"), "0 GPU(s) seen by nvidia-smi"),
    ("csv", printing("name, memory.total [MiB]\nNVIDIA H100 80GB HBM3, 81559 MiB\n"), "0 GPU(s) seen by nvidia-smi"),
    (
        "xml",
        printing('<?xml version="1.0" ?>\n<nvidia_smi_log><gpu id="00000000:18:00.0"/></nvidia_smi_log>\n'),
        "0 GPU",
    ),
    (
        "cut-after-3-gpus",
        printing(HEALTHY[: HEALTHY.index("GPU 00000000:", HEALTHY.index("GPU 00000000:5D"))]),
        "3 GPU",
    ),
    ("one-gpu-gone", printing((DATA / "h100-gpu-missing.txt").read_text()), "7 GPU(s) seen by nvidia-smi"),
]


def check(tmp_path, monkeypatch, capsys, answer) -> tuple[int, str]:
    """``python -m hpc.node.health --gpus 8`` with ``answer`` as nvidia-smi; its exit code and output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    if answer == "dir":
        tool.mkdir()
    elif isinstance(answer, bytes):
        tool.write_bytes(answer)
        tool.chmod(0o644)
    elif answer is not None:
        tool.write_text(answer)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin")
    monkeypatch.setenv("SLURMD_NODENAME", "g07")
    monkeypatch.setattr(health, "NVIDIA_SMI_TIMEOUT_S", 1)
    code = health.main(["--gpus", str(GPUS)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("case,answer,said", ANSWERS, ids=[a[0] for a in ANSWERS])
def test_a_node_whose_nvidia_smi_does_not_vouch_for_its_gpus_fails(tmp_path, monkeypatch, capsys, case, answer, said):
    code, out = check(tmp_path, monkeypatch, capsys, answer)
    assert code != 0 and "[health] g07: FAILED" in out, out
    assert [line for line in out.splitlines() if "FAIL" in line and said in line], out


@pytest.mark.parametrize("n", range(len(BAD_FIELDS)), ids=[f"{f[0][-1]}-{f[1]}" for f in BAD_FIELDS])
def test_each_field_the_check_reads_fails_the_gpu_it_is_bad_on(tmp_path, monkeypatch, capsys, n):
    section, key, value, said = BAD_FIELDS[n]
    gpu = n % GPUS
    code, out = check(tmp_path, monkeypatch, capsys, printing(set_field(HEALTHY, gpu, section, key, value)))
    assert code != 0, out
    failed = [line for line in out.splitlines() if "FAIL" in line and "[health] g07:" not in line]
    assert failed and all(f"gpu {gpu} (" in line for line in failed), out
    assert any(said in line for line in failed), out


@pytest.mark.parametrize(
    "field", [None, *FINE_FIELDS], ids=["as-recorded", *[f"{f[0][-1]}-{f[1]}" for f in FINE_FIELDS]]
)
def test_the_healthy_recording_passes_with_fields_that_are_no_fault(tmp_path, monkeypatch, capsys, field):
    text = HEALTHY if field is None else set_field(HEALTHY, 3, *field)
    code, out = check(tmp_path, monkeypatch, capsys, printing(text))
    assert code == 0 and out.rstrip().endswith("[health] g07: healthy"), out
