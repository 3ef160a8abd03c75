"""Real GPU faults, as PyTorch raises them on this GPU, judged by the fault table (hpc/node/fault_table.py).

    python bench/gpu_faults.py [--out FILE.json]

Each fault runs in a process of its own (a sticky CUDA error loses the process' context): it provokes the fault,
catches what reaches Python, and prints the exception's type, the code it carries, whether the next CUDA call fails
too (sticky), and `classify`'s verdict beside the one the table is meant to give. The parent prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from one_gpu import emit  # bench/, first on sys.path as the script runs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# fault -> the cause the table should give it: a kernel's bad address, an index out of range and out of memory are the
# program's, two ranks on one GPU is NCCL used wrongly; a kernel's trap reaches Python as the same 719 ("unspecified
# launch failure") as a GPU's fault, so it is a suspected node fault that the health stage and the error's return on
# another node then judge (hpc.node.restart_policy)
EXPECTED = {
    "device-assert": "program",
    "illegal-address": "program",
    "misaligned-address": "program",
    "trap": "node",
    "out-of-memory": "program",
    "nccl-two-ranks-one-gpu": "program",
}


def _triton_fault(kind: str) -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def poke(ptr, off):
        tl.store(ptr + off, 1.0)

    @triton.jit
    def misaligned(ptr):
        p = (ptr + 1).to(tl.pointer_type(tl.float32))
        tl.store(p, 1.0)

    @triton.jit
    def trap(ptr):
        x = tl.load(ptr)
        y = tl.inline_asm_elementwise("trap; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)
        tl.store(ptr, y)

    if kind == "illegal-address":
        x = torch.zeros(4, device="cuda")
        poke[(1,)](x, 1 << 40)
    elif kind == "misaligned-address":
        x = torch.zeros(16, dtype=torch.int8, device="cuda")
        misaligned[(1,)](x)
    else:
        x = torch.zeros(4, dtype=torch.int32, device="cuda")
        trap[(1,)](x)
    torch.cuda.synchronize()


def _provoke(kind: str) -> None:
    import torch

    if kind == "device-assert":
        t = torch.zeros(3, device="cuda")
        i = torch.tensor([5], device="cuda")
        t[i].sum().item()
    elif kind == "out-of-memory":
        torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
    elif kind in ("illegal-address", "misaligned-address", "trap"):
        _triton_fault(kind)
    else:
        raise SystemExit(f"unknown fault {kind}")


def _record(exc: BaseException) -> dict:
    from hpc.node.fault_table import classify, qualified

    chain, e = [], exc
    while e is not None and len(chain) < 4:
        chain.append(
            {
                "type": qualified(type(e)),
                "mro": [qualified(t) for t in type(e).__mro__[1:4]],
                "error_code": getattr(e, "error_code", None),
                "message": str(e)[:2000],
            }
        )
        e = e.__cause__ or e.__context__
    v = classify(exc)
    return {"chain": chain, "verdict": v.cause, "judged_as": v.signature, "why": v.what}


def child(kind: str) -> None:
    import torch

    out: dict = {"fault": kind, "expected": EXPECTED[kind]}
    try:
        _provoke(kind)
        out["raised"] = None
    except Exception as exc:
        out["raised"] = _record(exc)
        try:
            torch.ones(1, device="cuda").add_(1).item()
            out["sticky"] = False
        except Exception as again:
            out["sticky"] = True
            out["next_call"] = _record(again)
    print("RESULT " + json.dumps(out), flush=True)


def nccl_rank(rank: int, port: int) -> None:
    """Two ranks of one NCCL job on the same GPU: NCCL refuses ("Duplicate GPU detected")."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.cuda.set_device(0)
    out: dict = {"fault": "nccl-two-ranks-one-gpu", "expected": EXPECTED["nccl-two-ranks-one-gpu"], "rank": rank}
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        out["raised"] = None
    except Exception as exc:
        out["raised"] = _record(exc)
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)


def run_child(args: list[str], timeout: float = 120) -> list[dict]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    results = [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    for r in results:
        r["seconds"] = round(time.monotonic() - t0, 2)
        r["exit"] = p.returncode
    if not results:
        results = [{"fault": args[-1], "exit": p.returncode, "stderr_tail": p.stderr[-800:]}]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child")
    ap.add_argument("--nccl-rank", type=int)
    ap.add_argument("--port", type=int, default=29611)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.child:
        return child(a.child)
    if a.nccl_rank is not None:
        return nccl_rank(a.nccl_rank, a.port)
    import torch

    report: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "faults": [],
    }
    for kind in ("device-assert", "illegal-address", "misaligned-address", "trap", "out-of-memory"):
        report["faults"] += run_child(["--child", kind])
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--nccl-rank", str(r), "--port", str(a.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    for p in procs:
        try:
            so, se = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        got = [json.loads(x[7:]) for x in so.splitlines() if x.startswith("RESULT ")]
        report["faults"] += got or [{"fault": "nccl-two-ranks-one-gpu", "exit": p.returncode, "stderr_tail": se[-800:]}]
    faults = report["faults"]
    report["all_as_expected"] = all(f.get("raised") and f["raised"]["verdict"] == f["expected"] for f in faults)
    emit(report, a.out)


if __name__ == "__main__":
    main()
