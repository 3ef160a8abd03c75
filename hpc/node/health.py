"""A node's GPU health, checked before training: one task per node runs

    python -m hpc.node.health --gpus G [--matmul-tflops T] [--copy-gbps B] [--min-fraction F] [--mark DIR]

Checks, where the partition has GPUs (G > 0): from ``nvidia-smi -q``: the GPU count against the partition's,
uncorrectable ECC errors, pages pending retirement, rows pending remapping or a remapping failure, hardware or
thermal slowdown, application clocks or a power cap set below the defaults (a node whose nvidia-smi is missing or
fails is not healthy: no driver answers for its GPUs); a short bf16 matmul (TFLOP/s) and a device copy (GB/s) on
every GPU against the profile's expectation; ``dcgmi diag -r 1`` where dcgmi exists. With G = 0 (a CPU partition)
nvidia-smi is not asked. Without CUDA in torch the matmul and copy run on the CPU (reported, not judged).
One line per finding, ``[health] NODE ...``; exit 0: healthy, 1: a check failed (the node is named).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from hpc.node.cli import Parser, number, path_text, whole
from hpc.node.contract import EXIT_FAILED, HEALTH_MODULE, MAX_GPUS_PER_NODE
from hpc.node.slurm_env import node_name
from hpc.node.tool import ToolMissing, ToolTimeout, run_tool

PROG = HEALTH_MODULE
DEFAULT_MIN_FRACTION = 0.8  # a GPU below this fraction of the profile's matmul or copy rate fails
MAX_GPUS = MAX_GPUS_PER_NODE  # GPUs per node a job may ask for (as hpc.node.preflight_node)
MAX_RATE = 1e6  # TFLOP/s or GB/s an expectation may state
DCGM_TIMEOUT_S = 300
NVIDIA_SMI_TIMEOUT_S = 120


@dataclass(frozen=True)
class Finding:
    where: str  # "gpu 3", "node"
    ok: bool
    text: str

    def line(self, node: str) -> str:
        return f"[health] {node} {self.where}: {'ok' if self.ok else 'FAIL'}: {self.text}"


def parse_smi_q(text: str) -> list[dict]:
    """``nvidia-smi -q`` text -> one nested dict per GPU (section titles map to dicts, ``key : value`` to strings)."""
    gpus: list[dict] = []
    stack: list[tuple[int, dict]] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        if indent == 0:
            if line.startswith("GPU "):
                gpus.append({"bus_id": line[4:]})
                stack = [(0, gpus[-1])]
            else:
                stack = []
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if ":" in line:
            key, _, value = line.partition(":")
            parent[key.strip()] = value.strip()
        else:
            parent[line] = {}
            stack.append((indent, parent[line]))
    return gpus


def _get(d: dict, *path: str):
    """The value at the first section of each step that exists (names vary between driver versions), else None."""
    for step in path:
        if not isinstance(d, dict):
            return None
        d = next((d[k] for k in step.split("|") if k in d), None)
    return d


def _number(value) -> Optional[float]:
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value) if isinstance(value, str) else None
    return float(m.group(1)) if m else None


def check_gpu(gpu: dict) -> list[Finding]:
    """The health problems that ``nvidia-smi -q`` shows for one GPU (an empty list: none)."""
    where = f"gpu {gpu.get('Minor Number', '?')} ({gpu['bus_id']})"
    bad: list[str] = []
    volatile = _get(gpu, "ECC Errors", "Volatile") or {}
    flat = _flatten(volatile)
    counts = {k: v for k, v in flat.items() if "Uncorrectable" in k or "Double Bit" in k}
    if any(k.endswith("Total") for k in counts):  # older drivers: per memory kind, then their total
        counts = {k: v for k, v in counts.items() if k.endswith("Total")}
    uncorrectable = {k: n for k, v in counts.items() if (n := _number(v))}
    if uncorrectable:
        bad.append(
            f"{sum(uncorrectable.values()):g} uncorrectable ECC error(s) since the last reset "
            f"({', '.join(f'{k} {v:g}' for k, v in uncorrectable.items())})"
        )
    if str(_get(gpu, "Retired Pages", "Pending Page Blacklist|Pending Page Retirement")).lower() == "yes":
        bad.append("a page is pending retirement (needs a GPU reset)")
    remap = _get(gpu, "Remapped Rows") or {}
    if isinstance(remap, dict):
        if str(remap.get("Pending")).lower() == "yes":
            bad.append("a row remapping is pending (needs a GPU reset)")
        if str(remap.get("Remapping Failure Occurred")).lower() == "yes":
            bad.append("row remapping failed: the memory cannot be repaired")
    reasons = _flatten(_get(gpu, "Clocks Event Reasons|Clocks Throttle Reasons") or {})
    slow = [k for k, v in reasons.items() if v == "Active" and re.search(r"HW|Thermal|Power Brake", k)]
    if slow:
        bad.append(f"clocks held down: {', '.join(slow)} active")
    for kind in ("Graphics", "Memory"):
        app, default = (_number(_get(gpu, s, kind)) for s in ("Applications Clocks", "Default Applications Clocks"))
        if app is not None and default is not None and app < default:
            bad.append(f"application {kind.lower()} clock {app:g} MHz is below the default {default:g} MHz")
    power = _get(gpu, "GPU Power Readings|Power Readings") or {}
    limit = _number(power.get("Current Power Limit") or power.get("Enforced Power Limit") or power.get("Power Limit"))
    default = _number(power.get("Default Power Limit"))
    if limit is not None and default is not None and limit < default:
        bad.append(f"power capped at {limit:g} W, below the default {default:g} W")
    if bad:
        return [Finding(where, False, p) for p in bad]
    return [
        Finding(where, True, f"{gpu.get('Product Name', 'GPU')}: no ECC, retirement, remapping, clock or power problem")
    ]


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{name} / "))
        else:
            out[name] = v
    return out


def check_smi(text: str, expected_gpus: int) -> list[Finding]:
    """The GPU count against the partition's, then each GPU's findings."""
    gpus = parse_smi_q(text)
    count = Finding(
        "node", len(gpus) >= expected_gpus, f"{len(gpus)} GPU(s) seen by nvidia-smi; the partition has {expected_gpus}"
    )
    return [count] + [f for g in gpus for f in check_gpu(g)]


def bench(device, matmul_n: int, copy_bytes: int, iters: int) -> tuple[float, float]:
    """(TFLOP/s of an n x n matmul, GB/s read plus written by a device copy) on one device."""
    import torch

    from hpc.node.bandwidth import copy_bandwidth

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(matmul_n, matmul_n, dtype=dtype, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    tflops = 2 * matmul_n**3 * iters / (time.perf_counter() - start) / 1e12
    copy = copy_bandwidth([copy_bytes], device, iters=iters)[0]["copy_gbps"]
    return tflops, copy


def judge(where: str, what: str, measured: float, unit: str, expected: Optional[float], fraction: float) -> Finding:
    if expected is None:
        return Finding(where, True, f"{what} {measured:.3g} {unit} (the profile has no expectation)")
    ok = measured >= fraction * expected
    return Finding(
        where,
        ok,
        f"{what} {measured:.3g} {unit}, {measured / expected:.0%} of the expected {expected:g}"
        + ("" if ok else f" (below {fraction:g} x)"),
    )


def check_performance(gpus: int, tflops: Optional[float], copy_gbps: Optional[float], fraction: float) -> list[Finding]:
    """Matmul and copy rates on every CUDA device (judged against the profile), else once on the CPU (reported)."""
    import torch

    if not torch.cuda.is_available():
        t, c = bench(torch.device("cpu"), 512, 64 << 20, 3)
        return [
            Finding(
                "cpu", True, f"fp32 matmul {t:.3g} TFLOP/s, memory copy {c:.3g} GB/s (no CUDA device: reported only)"
            )
        ]
    found = []
    for i in range(torch.cuda.device_count()):
        t, c = bench(torch.device("cuda", i), 8192, 1 << 30, 20)
        found += [
            judge(f"gpu {i}", "bf16 matmul", t, "TFLOP/s", tflops, fraction),
            judge(f"gpu {i}", "HBM copy", c, "GB/s", copy_gbps, fraction),
        ]
    return found


def check_dcgm() -> list[Finding]:
    """``dcgmi diag -r 1`` (seconds) where DCGM is installed."""
    if shutil.which("dcgmi") is None:
        return []
    try:
        r = run_tool(["dcgmi", "diag", "-r", "1"], DCGM_TIMEOUT_S)
    except OSError:
        return [Finding("dcgm", False, f"dcgmi diag -r 1 did not finish within {DCGM_TIMEOUT_S} s")]
    failed = [" ".join(line.strip("|+ ").split()) for line in r.stdout.splitlines() if re.search(r"\bFail", line)]
    if r.returncode != 0 or failed:
        return [Finding("dcgm", False, f"dcgmi diag -r 1: {'; '.join(failed) or f'exit code {r.returncode}'}")]
    return [Finding("dcgm", True, "dcgmi diag -r 1 passed")]


@dataclass(frozen=True)
class NoSmi:
    """Why this node gave no ``nvidia-smi -q`` output."""

    why: str


def read_smi() -> Union[str, NoSmi]:
    """This node's ``nvidia-smi -q`` output, or why there is none (not on PATH, timed out, failed)."""
    try:
        r = run_tool(["nvidia-smi", "-q"], NVIDIA_SMI_TIMEOUT_S)
    except ToolMissing:
        return NoSmi("nvidia-smi is not on PATH (no NVIDIA driver)")
    except ToolTimeout:
        return NoSmi(f"nvidia-smi -q did not answer within {NVIDIA_SMI_TIMEOUT_S} s")
    except OSError as e:
        return NoSmi(f"nvidia-smi -q could not run ({e.strerror or e})")
    if r.returncode != 0:
        said = next((line.strip() for line in (r.stderr + r.stdout).splitlines() if line.strip()), "no message")
        return NoSmi(f"nvidia-smi -q failed with exit code {r.returncode}: {said}")
    return r.stdout


def smi_findings(gpus: int, smi: Callable[[], Union[str, NoSmi]]) -> list[Finding]:
    """nvidia-smi's checks where the partition has GPUs; ``smi`` (asked only then) gives its output or why none."""
    if gpus == 0:
        return [Finding("node", True, "the partition has no GPUs: nvidia-smi not asked")]
    answer = smi()
    if isinstance(answer, NoSmi):
        return [Finding("node", False, f"{answer.why}: the partition has {gpus} GPU(s) per node, none checked")]
    return check_smi(answer, gpus)


def node_findings(
    gpus: int,
    tflops: Optional[float],
    copy_gbps: Optional[float],
    fraction: float,
    smi: Callable[[], Union[str, NoSmi]] = read_smi,
) -> list[Finding]:
    """Every check of this node: nvidia-smi's (``smi``), performance, DCGM."""
    return smi_findings(gpus, smi) + check_performance(gpus, tflops, copy_gbps, fraction) + check_dcgm()


def mark_dir(text: str) -> str:
    """argparse type of --mark: a path whose nearest existing folder is a folder (it is made on failure)."""
    path = Path(path_text(text))
    above = next((p for p in (path, *path.parents) if p.exists()), None)
    if above is not None and not above.is_dir():
        raise argparse.ArgumentTypeError(f"{above} is not a directory")
    return text


def main(argv=None) -> int:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    p.add_argument(
        "--gpus", type=whole(0, MAX_GPUS), required=True, help="GPUs the partition has per node (0: a CPU partition)"
    )
    p.add_argument(
        "--matmul-tflops",
        type=number(0, MAX_RATE, lo_open=True),
        help="expected bf16 matmul TFLOP/s per GPU (the profile's)",
    )
    p.add_argument(
        "--copy-gbps", type=number(0, MAX_RATE, lo_open=True), help="expected device copy GB/s per GPU (the profile's)"
    )
    p.add_argument(
        "--min-fraction",
        type=number(0, 1, lo_open=True),
        default=DEFAULT_MIN_FRACTION,
        help="fail below this fraction of an expectation",
    )
    p.add_argument(
        "--mark",
        metavar="DIR",
        type=mark_dir,
        help="on failure, create DIR/NODE (the batch script requeues without NODE)",
    )
    a = p.parse_args(argv)
    node = node_name()
    found = node_findings(a.gpus, a.matmul_tflops, a.copy_gbps, a.min_fraction)
    for f in found:
        print(f.line(node), flush=True)
    failed = [f for f in found if not f.ok]
    if failed:
        print(f"[health] {node}: FAILED {len(failed)} check(s); exclude it with --exclude {node}", flush=True)
        if a.mark:
            Path(a.mark).mkdir(parents=True, exist_ok=True)
            (Path(a.mark) / node).touch()
        return EXIT_FAILED
    print(f"[health] {node}: healthy", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
