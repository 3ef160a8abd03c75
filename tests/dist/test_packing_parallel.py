"""Packing by document: rows hold whole samples, positions restart, labels never cross a sample; a packed row's
loss and gradients equal those of its samples run one by one; the masked fused cross-entropy."""

from __future__ import annotations


def test_packed_rows_equal_samples_one_by_one_under_dp2_tp2():
    """tests/scripts/packed_parallel.py on 4 CPU ranks: loss and every gathered gradient against the samples alone."""
    import subprocess
    import sys

    from train_helpers import ROOT, clean_env

    script = ROOT / "tests" / "scripts" / "packed_parallel.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(script)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("[packed_parallel]")), None)
    print(line)
    assert proc.returncode == 0 and line is not None and line.endswith("equal"), (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )
