"""Faults by cause on the local cluster (hpc/node/fault_table.py): the exceptions PyTorch raises for a GPU's and
NCCL's errors, built as torch builds them, in the trainer's ranks (HPC_TEST_FAULTS, train/faults.py) and in a user's
script (tests/scripts/gpu_fault.py). The cluster's test fake of nvidia-smi reports the faulty recording for the nodes
the test flags, the healthy one elsewhere, so the restart's GPU check of a node can fail or pass."""

import re
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, wait_job

from hpc.node.attempt import read
from hpc.node.restart import read_log
from slurm.requeue_checks import batch_log, submit, wait_for
from slurm.spare_checks import Run, hook_fault, row, spare_site, spare_site_with_faulty_gpus

pytestmark = pytest.mark.slurm


def flagged_smi_site(tmp_path: Path) -> tuple[Path, Path]:
    """The spare profile with the faulty recording on a node with a file in the returned folder."""
    flags = tmp_path / "bad-gpus"
    flags.mkdir()
    return spare_site_with_faulty_gpus(tmp_path, f'[ -e "{flags}/$SLURMD_NODENAME" ]'), flags


def test_the_trainers_gpu_and_nccl_errors_blame_a_node_only_when_its_gpus_fail(slurm, tmp_path, monkeypatch):
    """One job, three faults: an uncorrectable ECC error (torch.AcceleratorError 214) on a node whose GPUs then fail
    their check: restarted without it (it leaves the job); an ncclSystemError (DistBackendError) on a node whose GPUs
    pass: restarted, the node kept and not blamed; a device-side assert (AcceleratorError 710): the program's error,
    the job ends."""
    t0 = time.time()
    site, flags = flagged_smi_site(tmp_path)
    monkeypatch.setenv("HPC_TEST_FAULTS", "ecc@1:6:0,nccl-system@2:9:1,device-assert@0:12:2")
    run = Run(tmp_path, "gpufaults", submit(tmp_path, "gpufaults", "srun", "--spare-nodes", "1", site=str(site)))
    wait_for(lambda: len(read(run.attempt(0)).starts) == 4, timeout=600, what="attempt 0's ranks")
    bad = run.rank(0, 1)["node"]
    (flags / bad).touch()  # its GPUs report uncorrectable ECC errors from now on
    rows = []
    t, node = hook_fault(run, 0)
    rec = run.decision(0)
    rows.append(row("ECC error (AcceleratorError 214), GPUs fail their check", rec, t, node))
    assert node == bad and (rec["kind"], rec["confirmed"], rec["action"], rec["out"]) == (
        "node fault",
        True,
        "restart",
        [bad],
    ), rec
    assert rec["signature"] == "torch.AcceleratorError cudaErrorECCUncorrectable"
    t, node = hook_fault(run, 1)
    rec = run.decision(1)
    rows.append(row("ncclSystemError (DistBackendError), GPUs pass their check", rec, t, node))
    assert (rec["kind"], rec["confirmed"], rec["action"], rec["out"]) == ("node fault", False, "restart", []), rec
    assert rec["signature"] == "torch.distributed.DistBackendError ncclSystemError" and node in rec["next_nodes"]
    t, node = hook_fault(run, 2)
    rec = run.decision(2)
    rows.append(row("device-side assert (AcceleratorError 710)", rec, t, node))
    assert (rec["kind"], rec["action"]) == ("error", "end"), rec
    assert wait_job(run.job) == "FAILED"
    log = batch_log(run.dir, run.job)
    assert f"[restart] {bad} failed its GPU checks" in log and f"[health] {bad} gpu" in log, log[-3000:]
    assert "[restart] a suspected node fault on" in log and " passed its GPU checks" in log
    rank0 = (run.dir / f"{run.job}_0_log.out").read_text()
    assert "torch.AcceleratorError cudaErrorAssert (a device-side assert" in rank0 and "the program's error" in rank0
    print(f"\n[faults] trainer job {run.job} in {time.time() - t0:.0f} s")
    for r in rows:
        times = ", ".join(f"{k} {v:.1f} s" for k, v in r["t"].items())
        print(f"[faults] {r['fault']}: {r['kind']} on {r['node']} -> {r['action']}; {r['lost']} step(s) lost; {times}")


def test_a_scripts_gpu_error_back_on_another_node_is_the_programs_and_ends_the_job(slurm, tmp_path):
    """A user's script under reported_faults: rank 1 raises AcceleratorError 719 (a suspected node fault); its node's
    GPUs pass their check, so the ranks restart with a spare in its place, where rank 1 raises the same error again:
    the program's error, the job ends FAILED, with one restart and no requeue."""
    t0 = time.time()
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        str(spare_site(tmp_path)),
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--job-name",
        "scriptfault",
        "--time",
        "5",
        "--wait",
        "--",
        str(ROOT / "tests" / "scripts" / "gpu_fault.py"),
        cwd=tmp_path,
        timeout=600,
    )
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    run = Run(tmp_path, "scriptfault", job)
    log = batch_log(run.dir, job)
    assert r.returncode == 1, r.stdout + r.stderr + log[-3000:]
    first, second = sorted(read_log(run.dir / "restarts.jsonl", job), key=lambda rec: rec["attempt"])  # it ended
    sig = "torch.AcceleratorError cudaErrorLaunchFailure"
    assert (first["kind"], first["signature"], first["confirmed"], first["action"]) == (
        "node fault",
        sig,
        False,
        "restart",
    ), first
    assert second["action"] == "end" and second["nodes"] != first["nodes"], second
    assert (
        f"not restarted: the same error ({sig}) came back on {second['nodes'][0]} after it restarted the ranks off "
        f"{first['nodes'][0]}: the program's error"
    ) in log, log[-3000:]
    assert "requeueing" not in log and "[job] ranks ended with exit code 94: not requeued" in log
    print(f"\n[faults] script job {job}: the same AcceleratorError 719 on two nodes, ended in {time.time() - t0:.0f} s")
