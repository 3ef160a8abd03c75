"""In-job restarts on spare nodes, on the local cluster: the fault catalogue.

One run (the requeue scenarios' job: dp2 x tp2 on 2 nodes, here with 1 spare node and HPC_DIST_TIMEOUT_S=15) meets
one fault per start of its ranks, each after the previous restart trained again: a rank SIGKILLed, a segfault, a rank
stopped (SIGSTOP: a hang), a rank stuck holding the GIL, every process of a node killed at once, a rank SIGKILLed in
the middle of a checkpoint save (each restarted within the job, the faulted node replaced), then an exception in one
rank (not restarted: the job fails). The same job name submitted again meets ``sys.exit(1)`` in one rank (not
restarted), and once more runs to the end: its per-step losses, grad norms, data positions and exported weights equal
the uninterrupted baseline bit for bit. The signals come from this test; the segfault, the GIL, the exception and the
exit from the ranks themselves (HPC_TEST_FAULTS, train/faults.py). Printed: per fault, what was decided, the node
replaced, the seconds from the fault to training again (detection, teardown, restart, load) and the steps lost.
"""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_cli, wait_job
from hpc.node.attempt import read
from hpc.node.restart import read_log
from slurm.requeue_checks import assert_completed, assert_same_as_baseline, batch_log, submit, wait_for

pytestmark = pytest.mark.slurm

TIMEOUT_S = 15
FAULT_LINE = re.compile(r"\[fault\] rank (\d+) on (\S+) \(pid \d+\) at ([\d.]+): HPC_TEST_FAULTS: (\S+) after step (\d+)")


def spare_site(tmp_path: Path, **restart) -> Path:
    """The local profile with 1 spare node per job and room for many restarts (a node goes back to the spares)."""
    data = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())
    data["restart"] = {"spare_nodes": 1, "max_restarts": 10, "max_restarts_per_node": 10, **restart}
    path = tmp_path / "spares.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Run:
    """One job of the run: its attempts' records and its restart log."""

    def __init__(self, tmp_path: Path, name: str, job: str):
        self.dir, self.job = tmp_path / "jobs" / name, job
        self.ckpt = tmp_path / "checkpoints" / name

    def attempt(self, a: int) -> Path:
        return self.dir / f".restarts-{self.job}-0" / f"attempt-{a}"

    def wait_step(self, a: int, step: int, timeout: float = 600) -> None:
        wait_for(lambda: read(self.attempt(a)).progress.get("step", 0) >= step, timeout=timeout, poll=0.05,
                 what=f"attempt {a} of job {self.job} at step {step}")

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
    tmp = wait_for(lambda: [p for p in run.ckpt.iterdir() if ".tmp-" in p.name], poll=0.002, what="a save in progress")[0]
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
    out = {"fault": name, "kind": rec["kind"], "action": rec["action"], "node": node, "replaced": rec.get("replaced"),
           "lost": None, "t": {}}
    if rec.get("trained_at"):
        out["lost"] = rec["step"] - rec["resumed_step"]
        out["t"] = {"detection": rec["seen_at"] - t_fault, "teardown": rec["ended_at"] - rec["seen_at"],
                    "restart": rec["load_started_at"] - rec["ended_at"], "load": rec["loaded_at"] - rec["load_started_at"],
                    "training again": rec["trained_at"] - t_fault}
    return out


def test_the_fault_catalogue_restarts_within_the_job_and_ends_equal_to_the_baseline(slurm, tmp_path, requeue_baseline,
                                                                                     monkeypatch):
    t0 = time.time()
    site = str(spare_site(tmp_path))
    monkeypatch.setenv("HPC_DIST_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setenv("HPC_TEST_FAULTS", "segfault@2:22:1,gil@1:38:3,exception@2:55:6")
    a_run = Run(tmp_path, "faults", submit(tmp_path, "faults", "srun", "--spare-nodes", "1", site=site))
    rows = []

    def restarted(a: int, name: str, kind: str, fault) -> None:
        t, node = fault()
        rec = a_run.decision(a)
        rows.append(row(name, rec, t, node))
        assert (rec["kind"], rec["action"], rec["nodes"]) == (kind, "restart", [node]), rec
        assert node in rec["replaced"] and rec["replaced"][node] not in rec["attempt_nodes"], rec  # a spare took its place

    a_run.wait_step(0, 8)
    restarted(0, "SIGKILL of a rank", "died", lambda: signal_rank(a_run, 0, 1, signal.SIGKILL))
    restarted(1, "segfault", "died", lambda: hook_fault(a_run, 1))
    a_run.wait_step(2, 26)
    restarted(2, "SIGSTOP of a rank (hang)", "hang", lambda: signal_rank(a_run, 2, 3, signal.SIGSTOP))
    restarted(3, "a rank holding the GIL", "hang", lambda: hook_fault(a_run, 3))
    a_run.wait_step(4, 42)
    restarted(4, "a node's processes killed at once", "vanished", lambda: kill_node(a_run, 4, 2))
    a_run.wait_step(5, 47)
    restarted(5, "SIGKILL in a checkpoint save", "died", lambda: kill_in_save(a_run, 5, 2))
    t, node = hook_fault(a_run, 6)
    rec = a_run.decision(6)
    rows.append(row("an exception in one rank", rec, t, node))
    assert (rec["kind"], rec["action"]) == ("error", "end"), rec
    assert wait_job(a_run.job) == "FAILED"
    log = batch_log(a_run.dir, a_run.job)
    assert re.search(rf"\[restart\] rank 2 on {node} ended with exit code 1 without a failed collective \(an error in "
                     r"the program\): not restarted: an error in the program is never restarted", log), log[-3000:]
    assert "[job] ranks ended with exit code 1: not requeued" in log
    assert "RuntimeError: injected fault after step 55" in (a_run.dir / f"{a_run.job}_2_log.out").read_text()
    assert log.count("[restart] restart ") == 6 and "requeueing" not in log  # six restarts within the job, no requeue

    resumed = max(int(p.name.split("-")[1]) for p in a_run.ckpt.iterdir() if re.fullmatch(r"step-\d{8}", p.name))
    monkeypatch.setenv("HPC_TEST_FAULTS", f"exit@1:{resumed + 2}:0")
    b_run = Run(tmp_path, "faults", submit(tmp_path, "faults", "srun", "--spare-nodes", "1", site=site))
    t, node = hook_fault(b_run, 0)
    rec = b_run.decision(0)
    rows.append(row("sys.exit(1) in one rank", rec, t, node))
    assert (rec["kind"], rec["action"]) == ("error", "end"), rec
    assert wait_job(b_run.job) == "FAILED"

    monkeypatch.delenv("HPC_TEST_FAULTS")
    c_run = Run(tmp_path, "faults", submit(tmp_path, "faults", "srun", "--spare-nodes", "1", site=site))
    assert_completed(c_run.job, c_run.dir, timeout=900)
    assert_same_as_baseline(c_run.dir, requeue_baseline)

    print(f"\n[spares] fault catalogue: jobs {a_run.job}, {b_run.job}, {c_run.job} in {time.time() - t0:.0f} s; final losses, "
          "grad norms, data positions and weights equal the baseline bit for bit")
    for r in rows:
        times = ", ".join(f"{k} {v:.1f} s" for k, v in r["t"].items())
        print(f"[spares] {r['fault']}: {r['kind']} on {r['node']} -> {r['action']}"
              + (f", {r['node']} replaced by {r['replaced'][r['node']]}, {r['lost']} step(s) lost; {times}" if r["t"] else ""))
    for r in rows:
        if r["t"]:  # the goal is checkpoint load + 60 s; the shared 2-core machine gets twice that
            assert r["t"]["training again"] < r["t"]["load"] + 120, r


def test_a_script_that_asks_for_no_restart_is_neither_restarted_nor_requeued(slurm, tmp_path):
    """Exit 93 (EXIT_NO_RESTART) in one rank of a script of one's own: the job ends FAILED at once."""
    script = tmp_path / "stop.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(93)\ntime.sleep(120)\n")
    r = run_cli("-m", "hpc.submit", "--site", str(spare_site(tmp_path)), "--nodes", "2", "--gpus-per-node", "1",
                "--job-name", "no-restart", "--time", "5", "--wait", "--", str(script), cwd=tmp_path, timeout=300)
    assert r.returncode == 1
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    log = batch_log(tmp_path / "jobs" / "no-restart", job)
    assert re.search(r"\[restart\] rank 1 on \S+ ended with exit code 93 \(do not restart or requeue\): not restarted: "
                     r"the program asked not to be restarted or requeued", log), log
    assert "[job] ranks ended with exit code 93: not requeued" in log and "attempt 1" not in log
