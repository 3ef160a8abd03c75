"""8 GPUs per node on the local cluster's gpu8 partition (n5, n6: 8 fake GPUs, 8 oversubscribed CPUs each): 2 x 8
stub ranks (tests/scripts/wiring_stub.py, no torch) through the design's line. Their wiring is checked against
Slurm's own variables, their GPUs against the step's, and the batch rule each applied for the demo config with a
global batch dp=8 does not divide against numpy's array_split of the step's rows."""

import json
import re

import numpy as np
import pytest
from conftest import ROOT, job_nodes, run_cli, wait_job

pytestmark = pytest.mark.slurm
STUB = ROOT / "tests" / "scripts" / "wiring_stub.py"
NODES, PER_NODE, GLOBAL_BATCH = 2, 8, 12


def test_2x8_stub_ranks_wire_bind_and_split_the_batch(slurm, tmp_path):
    out = tmp_path / "ranks"
    config = ROOT / "train" / "configs" / "demo.yaml"
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--partition",
        "gpu8",
        "--nodes",
        str(NODES),
        "--job-name",
        "gpu8-stub",
        "--",
        str(STUB),
        str(out),
        "--config",
        str(config),
        f"global_batch={GLOBAL_BATCH}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = re.search(r"submitted job (\d+)", r.stdout).group(1)
    assert wait_job(job) == "COMPLETED"
    hosts = job_nodes(job)
    recs = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(NODES * PER_NODE)]
    for rank, rec in enumerate(recs):
        assert rec["RANK"] == rec["SLURM_PROCID"] == str(rank) and rec["LOCAL_RANK"] == rec["SLURM_LOCALID"]
        assert rec["WORLD_SIZE"] == rec["SLURM_NTASKS"] == str(NODES * PER_NODE)
        assert rec["LOCAL_WORLD_SIZE"] == str(PER_NODE) and rec["MASTER_ADDR"] == hosts[0]
        assert rec["SLURMD_NODENAME"] == hosts[rank // PER_NODE]  # block distribution: node-major ranks
        gpus = rec["CUDA_VISIBLE_DEVICES"].split(",")
        assert rec["CUDA_VISIBLE_DEVICES"] == rec["SLURM_STEP_GPUS"] and len(gpus) == PER_NODE
        assert int(rec["LOCAL_RANK"]) < len(gpus)  # the rank's device, one per local rank
    assert sorted(int(r["LOCAL_RANK"]) for r in recs) == sorted(list(range(PER_NODE)) * NODES)
    tp = recs[0]["tp"]
    dp = NODES * PER_NODE // tp
    rows = np.array_split(np.arange(GLOBAL_BATCH), dp)
    for rank, rec in enumerate(recs):
        start, count = rec["share"]
        assert (rec["dp"], rec["tp"]) == (dp, tp)
        assert list(range(start, start + count)) == rows[rank // tp].tolist()  # a tp group shares its dp rank's rows
        assert rec["accum"] == max(len(x) for x in rows) // 4 + (max(len(x) for x in rows) % 4 > 0)  # micro_batch 4
