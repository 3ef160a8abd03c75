"""First program of each rank inside the test sandbox: record what of Slurm this rank can reach, then exec the rank
command.

sandbox_probe.py CMD ARGS...   (writes $HPC_JOB_DIR/sandbox/rank-R-restart-N.json)
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def try_run(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except OSError as e:
        return f"cannot run: {e.strerror}"
    return f"exit {r.returncode}: {(r.stdout + r.stderr).strip()[:200]}"


if __name__ == "__main__":
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    record = {
        "rank": int(os.environ["RANK"]),
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        "pid": os.getpid(),
        "scontrol_on_path": shutil.which("scontrol"),
        "scontrol_ping": try_run(["scontrol", "ping"]),
        "usr_bin_scontrol": try_run(["/usr/bin/scontrol", "ping"]),
        "slurm_conf_readable": os.access(conf, os.R_OK),
        "etc_slurm": sorted(os.listdir("/etc/slurm")) if os.path.isdir("/etc/slurm") else None,
    }
    out = Path(os.environ["HPC_JOB_DIR"]) / "sandbox" / f"rank-{record['rank']}-restart-{record['restart']}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(record))
    os.execvp(sys.argv[1], sys.argv[1:])
