"""Context parallelism through `python -m train`: the sequence split over ranks trains as one process does.

Three launches of the tiny Qwen3 (fp32 on CPU, gloo), seq_len 32: one process, cp=2 (two ranks, each 2 of the 4
chunks of every row; with activation checkpointing) and dp=2 x cp=2 (four ranks). Every step's loss and gradient
norm and the exported weights after the last step agree with the one process within TOL (relative for the gradient
norm): the attention's key/value all-gather, its backward, the global RoPE positions and the loss over the whole
rows are all in those numbers. The attention alone, for a load-balanced and a plain cut, is checked in fp64 by
tests/scripts/cp_attention.py.
"""

from __future__ import annotations

import pytest
from safetensors.torch import load_file
from train_helpers import finish, launch, metrics

STEPS = 10
TOL = 1e-5
LAYOUTS = {
    "one": (1, ()),
    "cp2": (2, ("parallel.cp=2", "activation_checkpointing=true")),  # the gathers run again in the recompute
    "dp2_cp2": (4, ("parallel.cp=2",)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("cp")
    common = (f"steps={STEPS}", "checkpoint.interval=0", "export=hf", "log.log_every=1")
    procs = {name: launch(n, base / name, *common, *extra) for name, (n, extra) in LAYOUTS.items()}
    return {name: (base / name, finish(proc, base / name)) for name, proc in procs.items()}


@pytest.mark.parametrize("layout", ["cp2", "dp2_cp2"])
def test_context_parallel_matches_one_process(runs, layout):
    (one, _), (run, out) = runs["one"], runs[layout]
    m1, m = metrics(one), metrics(run)
    assert sorted(m) == sorted(m1) == list(range(1, STEPS + 1))
    loss_diff = max(abs(m[k]["loss"] - m1[k]["loss"]) for k in m)
    gnorm_diff = max(abs(m[k]["grad_norm"] - m1[k]["grad_norm"]) / m1[k]["grad_norm"] for k in m)
    w1, w = load_file(one / "hf" / "model.safetensors"), load_file(run / "hf" / "model.safetensors")
    assert sorted(w) == sorted(w1)
    param_diff = max((w[k] - w1[k]).abs().max().item() for k in w)
    print(
        f"{layout} vs 1 process over {STEPS} steps: max |loss diff| {loss_diff:.2e}, max rel grad-norm diff "
        f"{gnorm_diff:.2e}, max |param diff| {param_diff:.2e}"
    )
    assert loss_diff < TOL and gnorm_diff < TOL and param_diff < TOL
    assert m[STEPS]["loss"] < m[1]["loss"] - 0.1, "loss did not fall"
    dp = 2 if layout == "dp2_cp2" else 1
    assert f"layout dp={dp} x cp=2 (4 chunks of 8 tokens per row) x tp=1" in out


def test_gathered_attention_equals_causal_attention_over_the_whole_sequence():
    """tests/scripts/cp_attention.py on 2 CPU ranks: output and gradients, load-balanced and plain cuts, in fp64."""
    import subprocess
    import sys

    from train_helpers import ROOT, clean_env

    script = ROOT / "tests" / "scripts" / "cp_attention.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("[cp_attention]")), None)
    print(line)
    assert proc.returncode == 0 and line is not None and line.endswith(": equal"), (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )
