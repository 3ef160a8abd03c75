"""What the spare-node scenarios share (test_spares.py, test_node_faults.py, test_heartbeat.py): the spare profile,
one job's attempts and decisions, the faults the test brings from outside, and one line of the fault table."""

import os
import re
import signal
import time
from pathlib import Path

import yaml
from conftest import ROOT

from hpc.node.attempt import read
from hpc.node.restart import read_log
from slurm.requeue_checks import wait_for

FAULTY_GPUS = "FAKE_NVIDIA_SMI_FAULTY_IF"  # scripts/fake_nvidia_smi.sh: where this command succeeds, faulty GPUs
FAULT_LINE = re.compile(
    r"\[fault\] rank (\d+) on (\S+) \(pid \d+\) at ([\d.]+): HPC_TEST_FAULTS: (\S+) after step (\d+)"
)


def spare_site(tmp_path: Path, **restart) -> Path:
    """The local profile with 1 spare node per job and room for many restarts (a node goes back to the spares)."""
    data = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())
    data["restart"] = {"spare_nodes": 1, "max_restarts": 10, "max_restarts_per_node": 10, **restart}
    path = tmp_path / "spares.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def spare_site_with_faulty_gpus(tmp_path: Path, faulty_if: str) -> Path:
    """``spare_site`` whose nodes' nvidia-smi (the cluster's test fake) prints the faulty recording where the bash
    command ``faulty_if`` succeeds on the node, the healthy one elsewhere."""
    site = spare_site(tmp_path)
    data = yaml.safe_load(site.read_text())
    data["environment"]["variables"][FAULTY_GPUS] = faulty_if
    site.write_text(yaml.safe_dump(data))
    return site


class Run:
    """One job of the run: its attempts' records and its restart log."""

    def __init__(self, tmp_path: Path, name: str, job: str):
        self.dir, self.job = tmp_path / "jobs" / name, job
        self.ckpt = tmp_path / "checkpoints" / name

    def attempt(self, a: int) -> Path:
        return self.dir / f".restarts-{self.job}-0" / f"attempt-{a}"

    def wait_step(self, a: int, step: int, timeout: float = 600) -> None:
        wait_for(
            lambda: read(self.attempt(a)).progress.get("step", 0) >= step,
            timeout=timeout,
            poll=0.05,
            what=f"attempt {a} of job {self.job} at step {step}",
        )

    def rank(self, a: int, rank: int) -> dict:
        return next(s for s in read(self.attempt(a)).starts if s["rank"] == rank)

    def decision(self, a: int, timeout: float = 300) -> dict:
        """Attempt ``a``'s decision, once its restart trained again (or it was not restarted)."""

        def done():
            rec = next((r for r in read_log(self.dir / "restarts.jsonl", self.job) if r.get("attempt") == a), None)
            return rec if rec and (rec.get("action") != "restart" or rec.get("trained_at")) else None

        return wait_for(done, timeout=timeout, what=f"the decision on attempt {a} of job {self.job}")


def signal_rank(run: Run, a: int, rank: int, sig: signal.Signals) -> tuple[float, str]:
    rec = run.rank(a, rank)
    t = time.time()
    os.kill(rec["pid"], sig)
    return t, rec["node"]


def kill_node(run: Run, a: int, rank: int) -> tuple[float, str]:
    """Every process of the job's step on rank ``rank``'s node at once, supervisors first (none leaves a record)."""
    node = run.rank(a, rank)["node"]
    recs = [s for s in read(run.attempt(a)).starts if s["node"] == node]
    t = time.time()
    for pid in [s["supervisor_pid"] for s in recs] + [s["pid"] for s in recs]:
        os.kill(pid, signal.SIGKILL)
    return t, node


def kill_in_save(run: Run, a: int, rank: int) -> tuple[float, str]:
    tmp = wait_for(lambda: [p for p in run.ckpt.iterdir() if ".tmp-" in p.name], poll=0.002, what="a save in progress")[
        0
    ]
    t, node = signal_rank(run, a, rank, signal.SIGKILL)
    assert tmp.exists(), "the kill did not land inside the save"
    return t, node


def hook_fault(run: Run, a: int) -> tuple[float, str]:
    """When and where the rank's own fault fired in attempt ``a`` (its [fault] line), once the attempt was decided."""
    run.decision(a, timeout=600)
    text = "".join(p.read_text() for p in run.dir.glob(f"{run.job}_*_log.out"))
    m = max(FAULT_LINE.finditer(text), key=lambda m: float(m.group(3)))
    return float(m.group(3)), m.group(2)


def row(name: str, rec: dict, t_fault: float, node: str) -> dict:
    """One line of the fault table, from the decision record and the test's own time of the fault."""
    out = {
        "fault": name,
        "kind": rec["kind"],
        "action": rec["action"],
        "node": node,
        "replaced": rec.get("replaced"),
        "lost": None,
        "t": {},
    }
    if rec.get("trained_at"):
        out["lost"] = rec["step"] - rec["resumed_step"]
        out["t"] = {
            "detection": rec["seen_at"] - t_fault,
            "teardown": rec["ended_at"] - rec["seen_at"],
            "restart": rec["load_started_at"] - rec["ended_at"],
            "load": rec["loaded_at"] - rec["load_started_at"],
            "training again": rec["trained_at"] - t_fault,
        }
    return out
