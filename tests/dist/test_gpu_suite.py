"""The GPU suite's plumbing on the CPU (``bench/gpu_suite.py --smoke``): the trainer's dense, LoRA and MoE runs
against transformers' and peft's from the same weights, adapters, data and schedule agree within fp32 rounding, a QLoRA
run starts and trains, the MLPs in tiles train as the whole sequences do, and the report (JSON, Markdown, plots) is
written."""

import json
import subprocess

from conftest import ROOT
from train_helpers import FP8_SITE, clean_env


def test_the_suite_smoke_run_passes_against_its_oracles(tmp_path):
    r = subprocess.run(
        ["bash", "scripts/test.sh", "gpu", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=clean_env(PYTHONPATH=str(FP8_SITE)),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "suite.json").read_text())
    results = report["results"]
    for part, sides in (
        ("dense", {"ours", "hf"}),
        ("lora", {"ours", "peft"}),
        ("moe", {"ours", "hf"}),
        ("tiled-mlp", {"ours", "ours-tiled"}),
    ):
        assert results[part]["verdict"]["pass"] is True and set(results[part]["sides"]) == sides, results[part]
        assert results[part]["verdict"]["max_abs_diff"] <= 1e-3
    moe = results["moe"]["sides"]
    assert all(len(s["load"]) == len(s["losses"]) and min(min(step) for step in s["load"]) >= 1 for s in moe.values())
    assert results["qlora"]["verdict"]["pass"] is True
    assert {results[p]["verdict"]["pass"] for p in ("fp8-lora", "compile")} == {None}
    assert {"suite.md", "curves.png", "moe_load.png"} <= {p.name for p in tmp_path.iterdir()}
