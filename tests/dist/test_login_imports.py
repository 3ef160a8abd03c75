"""The login side imports no torch, transformers or numpy: ``hpc.submit --dry-run`` (with and without the
planner), ``hpc.plan`` and ``hpc.jobs``, run one after another in one fresh interpreter."""

import json
import os

from conftest import ROOT, run_cli

HEAVY = ("torch", "transformers", "numpy")
TINY = str(ROOT / "train" / "configs" / "tiny.yaml")
RUNS = {
    "submit local --dry-run": ("hpc.submit", ["--site", "local", "--nodes", "1", "--dry-run"]),
    "submit ib-h200 --dry-run (planner)": (
        "hpc.submit",
        ["--site", "ib-h200", "--nodes", "2", "--dry-run", "--", "--config", TINY, "global_batch=32"],
    ),
    "plan": ("hpc.plan", ["--site", "ib-h200", "--nodes", "4", "--model", "8B"]),
    "jobs list": ("hpc.jobs", ["list"]),
}
PROBE = """
import contextlib, importlib, io, json, sys
runs, heavy, seen = json.loads(sys.argv[1]), tuple(sys.argv[2].split(",")), {}
for name, (module, argv) in runs.items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = None
        try:
            importlib.import_module(module).main(argv)
        except SystemExit as e:
            code = e.code
    seen[name] = {"code": code, "out": out.getvalue(), "heavy": [m for m in heavy if m in sys.modules]}
import train.data.formats  # the probe itself: the data formats import numpy
seen["control"] = {"heavy": [m for m in heavy if m in sys.modules]}
print(json.dumps(seen))
"""


def test_login_side_imports_no_torch(tmp_path):
    bin_dir = tmp_path / "bin"  # Slurm's clients answering with no jobs: jobs list runs to its end, without a cluster
    bin_dir.mkdir()
    for name in ("sacct", "squeue", "scontrol"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    r = run_cli(
        "-c",
        PROBE,
        json.dumps(RUNS),
        ",".join(HEAVY),
        cwd=tmp_path,
        timeout=120,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    for name in RUNS:
        assert seen[name]["heavy"] == [], f"{name} imported {seen[name]['heavy']}"
    assert seen["submit local --dry-run"]["code"] == 0 and seen["submit local --dry-run"]["out"].startswith(
        "#!/bin/bash"
    )
    assert "parallel.tp=1" in seen["submit ib-h200 --dry-run (planner)"]["out"]
    assert "proposal: dp=32 x tp=1" in seen["plan"]["out"]
    assert seen["jobs list"]["code"] in (0, None) and seen["jobs list"]["out"].startswith("JOBID")
    assert "numpy" in seen["control"]["heavy"]
