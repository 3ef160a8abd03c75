"""The slurm tier's fixture: the local cluster, already up (scripts/test.sh starts it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT


@pytest.fixture(scope="session")
def slurm() -> dict[str, str]:
    """The local cluster (scripts/cluster.sh up), shared by the whole test session: the one $SLURM_CONF names (a
    cluster's $LAB/env.sh sets it, and PATH for a newer Slurm's clients), else the local profile's."""
    import yaml

    conf = (
        os.environ.get("SLURM_CONF")
        or yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())["submission"]["slurm_conf"]
    )
    os.environ["SLURM_CONF"] = conf
    if shutil.which("sbatch") is None or not Path(conf).is_file():
        pytest.fail("the local Slurm cluster is not up: run `bash scripts/cluster.sh up` (scripts/test.sh does)")
    r = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"sinfo failed ({r.stderr.strip()}): start the cluster with `bash scripts/cluster.sh up`")
    # the nodes' /24 (scripts/cluster.sh's NET), from slurm.conf's NodeAddr=10.250.0.[11-14]
    net = re.search(r"^NodeName=.* NodeAddr=(\d+\.\d+\.\d+)\.", Path(conf).read_text(), re.M)
    return {"SLURM_CONF": conf, "NET": net.group(1) if net else "127.0.0"}


@pytest.fixture(scope="session")
def requeue_baseline(tmp_path_factory, worker_id) -> Path:
    """The uninterrupted torchrun run (dp2 x tp2) that every requeue scenario must equal bit for bit: trained once
    for the whole session, whichever xdist worker asks first (the others wait for it)."""
    from filelock import FileLock
    from train_helpers import finish, launch

    from slurm.requeue_checks import OVERRIDES

    base = tmp_path_factory.getbasetemp()
    run = (base if worker_id == "master" else base.parent) / "requeue-baseline"
    with FileLock(f"{run}.lock"):
        if not (run / "hf" / "model.safetensors").is_file():  # absent, or cut short by an earlier failure
            shutil.rmtree(run, ignore_errors=True)
            finish(launch(4, run, *OVERRIDES, f"checkpoint.dir={run / 'ckpt'}"), run, timeout=600)
    return run
