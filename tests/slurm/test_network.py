"""Node network checks: NCCL/gloo interface and HCA selection, on this machine's real interfaces,
through hpc.node.launch, and the bounded rendezvous timeout on the real cluster."""

import subprocess

import pytest
from conftest import PYTHON, ROOT, run_seconds, wait_job


@pytest.mark.slurm
def test_missing_rank_ends_the_job_within_the_timeout(slurm, tmp_path):
    """Rank 1 never joins: rank 0's rendezvous times out after HPC_DIST_TIMEOUT_S and srun ends the job."""
    rank_cmd = f'if [ "$RANK" = 1 ]; then sleep 300; else exec {PYTHON} -m hpc.node.smoke --out {tmp_path}/r; fi'
    script = tmp_path / "job.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N 2 --ntasks-per-node=1 --gpus-per-node=1 --time=5 -o {tmp_path}/%j.log\n"
        "export HPC_DIST_TIMEOUT_S=5 GLOO_SOCKET_IFNAME=eth0\n"
        f"srun --kill-on-bad-exit=1 -o {tmp_path}/%j-rank%t.log {PYTHON} -m hpc.node.launch -- bash -c '{rank_cmd}'\n"
    )
    sb = subprocess.run(["sbatch", "--parsable", "--chdir", str(ROOT), str(script)], capture_output=True, text=True)
    assert sb.returncode == 0, sb.stderr
    job = sb.stdout.strip()
    assert wait_job(job, timeout=600) == "FAILED"
    assert run_seconds(job) < 90  # the sleeping rank would hold the job for 300 s
    log = (tmp_path / f"{job}-rank0.log").read_text()
    assert "Timed out after" in log and "1/2 clients joined" in log
