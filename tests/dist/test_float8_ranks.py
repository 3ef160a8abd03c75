"""FP8 training (train/float8.py) as processes on CPU: emulated float8 under dp2 x tp2 (TP, FSDP2 with float8
all-gather) against one process (fp8 without a GPU, one line and exit 2, is checked in process:
tests/bad_input_cases.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from train_helpers import FP8_SITE, ROOT, clean_env


def test_emulated_float8_under_dp2_tp2_tracks_one_process(tmp_path, torchao_float8):
    """float8 -> TP -> FSDP2 (float8 all-gather over dp, weight scales precomputed after each step) on gloo: the first
    step's loss is one process's within float8 rounding (each dp rank scales its own activations), and both runs
    train."""
    script = ROOT / "tests" / "scripts" / "float8_layouts.py"
    procs = {}
    for name, nproc, tp in (("one", 1, 1), ("dp2tp2", 4, 2)):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(script),
            "--tp",
            str(tp),
            "--out",
            str(tmp_path / f"{name}.json"),
        ]
        procs[name] = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=clean_env(PYTHONPATH=f"{ROOT}:{FP8_SITE}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for _name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    one, sharded = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "dp2tp2"))
    assert (sharded["dp"], sharded["tp"], sharded["float8_modules"], one["float8_modules"]) == (2, 2, 14, 14)
    # float8 rounding: each dp rank scales its own half of the activations (0.011 apart with the seeded init)
    assert abs(one["losses"][0] - sharded["losses"][0]) < 0.02
    assert one["losses"][1] < one["losses"][0] and sharded["losses"][1] < sharded["losses"][0]
