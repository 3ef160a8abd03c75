"""Defaults that fit any shape: with no config of the user's, ``python -m hpc.submit --site S --nodes N --dry-run``
renders on every shipped profile (and the GPU forms of tests/sites/local-forms.yaml), every partition, every node count
from 1 to its max_nodes; the ranks of each script would train the config's global batch, each row once, with the
accumulation derived from their layout. The oracle deals the rows with numpy's array_split, not
train/front/batch_split.py."""

from __future__ import annotations

import math
import re
import shlex
import time

import numpy as np
import pytest
from conftest import ROOT

from hpc import submit as submit_cli
from hpc.site import SHIPPED_SITE_DIR, load_site
from train.front.config import load_config
from train.front.layout import ParallelDims, WorldEnv

PROFILES = sorted(SHIPPED_SITE_DIR.glob("*.yaml")) + [ROOT / "tests" / "sites" / "local-forms.yaml"]
SHAPES = [
    (path, part.name, nodes, part.gpus_per_node)
    for path in PROFILES
    for part in load_site(str(path)).partitions
    for nodes in range(1, part.max_nodes + 1)
]


def trainer_words(script: str) -> list[str]:
    """The trainer's arguments on the ranks' launch line."""
    line = next(x for x in script.splitlines() if x.endswith(" || rc=$?")).removesuffix(" || rc=$?")
    words = shlex.split(line)
    return words[words.index("train") + 1 :]


def oracle(global_batch: int, micro_batch: int, dp: int) -> tuple[list[int], int]:
    """Each dp rank's rows (array_split of the step's rows) and the micro-batches every rank runs."""
    rows = [len(x) for x in np.array_split(np.arange(global_batch), dp)]
    return rows, max(1, math.ceil(max(rows) / micro_batch))


def nearest_even(global_batch: int, dp: int) -> list[int]:
    """The nearest global batches below (if any) and above that dp divides, by search."""
    below = [g for g in range(dp, global_batch + 1) if g % dp == 0][-1:]
    return below + [next(g for g in range(global_batch + 1, global_batch + dp + 1) if g % dp == 0)]


def test_every_profile_renders_at_every_node_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("USER", "alice")
    monkeypatch.chdir(tmp_path)
    t0, seen = time.perf_counter(), set()
    for path, partition, nodes, gpus in SHAPES:
        argv = ["--site", str(path), "--partition", partition, "--nodes", str(nodes), "--dry-run"]
        with pytest.raises(SystemExit) as e:
            submit_cli.main(argv)
        out, err = capsys.readouterr()
        where = f"{path.name} {partition} --nodes {nodes}"
        assert e.value.code == 0, (where, err)
        assert f"#SBATCH --nodes={nodes}\n" in out and f"#SBATCH --partition={partition}\n" in out, where
        words = trainer_words(out)
        cfg = load_config(words[1], words[2:])
        dims = ParallelDims.build(cfg.parallel, WorldEnv(0, 0, nodes * gpus, gpus), cfg.model.kv_heads())
        split = dims.batch_split(cfg.global_batch, cfg.micro_batch)
        rows, accum = oracle(cfg.global_batch, cfg.micro_batch, dims.dp)
        assert dims.dp * dims.cp * dims.tp == nodes * gpus and cfg.global_batch == load_config(words[1]).global_batch, (
            where
        )
        assert [split.share(r)[1] for r in range(dims.dp)] == rows and split.accum == accum, where
        assert sum(split.share(r)[1] for r in range(dims.dp)) == cfg.global_batch, where
        uneven = cfg.global_batch % dims.dp != 0
        assert ("does not split evenly" in err) == uneven, (where, err)
        seen.add((path.name, uneven))
    # the 8-GPU profiles meet both an even and an uneven split, and the whole walk stays cheap
    assert {("ib-h200.yaml", True), ("ib-h200.yaml", False), ("aws-p5-efa.yaml", True)} <= seen
    assert len(SHAPES) >= 280 and time.perf_counter() - t0 < 120


@pytest.mark.parametrize(
    "global_batch, micro_batch, dp",
    [(16, 4, 8), (16, 4, 12), (16, 4, 256), (16, 1, 3), (1024, 2, 48), (7, 2, 1), (5, 3, 2)],
)
def test_the_split_against_array_split(global_batch, micro_batch, dp):
    split = ParallelDims(dp=dp, tp=1).batch_split(global_batch, micro_batch)
    rows, accum = oracle(global_batch, micro_batch, dp)
    starts = [0, *np.cumsum(rows)[:-1].tolist()]
    assert [split.share(r) for r in range(dp)] == list(zip(starts, rows, strict=True))
    assert split.accum == accum and split.real_micro_batches == sum(min(n, accum) for n in rows)
    assert split.idle_ranks == rows.count(0)
    note = split.uneven_note()
    assert (note is None) == (global_batch % dp == 0)
    if note:
        assert f"global_batch {' or '.join(map(str, nearest_even(global_batch, dp)))} splits evenly" in note, note


def test_a_checkpoint_of_another_global_batch_is_refused_in_one_line(tmp_path):
    import json
    from types import SimpleNamespace

    from train.resume import mismatch, written_with

    tiny = str(ROOT / "train" / "configs" / "tiny.yaml")
    hf = SimpleNamespace()
    step = tmp_path / "step-00000004"
    step.mkdir()
    saved = written_with(load_config(tiny), hf, None)
    (step / "meta.json").write_text(json.dumps({"step": 4, "written_with": saved}))
    assert mismatch([step], written_with(load_config(tiny, ["micro_batch=1"]), hf, None)) is None
    refusal = mismatch([step], written_with(load_config(tiny, ["global_batch=16"]), hf, None))
    assert "global_batch 8 (saved) vs 16 (now)" in refusal and "\n" not in refusal, refusal
    older = {k: v for k, v in saved.items() if k != "global_batch"}  # written before the global batch was recorded
    (step / "meta.json").write_text(json.dumps({"step": 4, "written_with": older}))
    assert mismatch([step], written_with(load_config(tiny, ["global_batch=16"]), hf, None)) is None


def test_the_planner_offers_the_nearest_even_global_batches(capsys):
    from hpc.plan import main as plan_main

    plan_main(["--site", "ib-h200", "--nodes", "3", "--model", "8B", "--global-batch", "16", "--micro-batch", "2"])
    out = capsys.readouterr().out
    dp = int(re.search(r"proposal: dp=(\d+)", out).group(1))
    assert f"global_batch {' or '.join(map(str, nearest_even(16, dp)))} splits evenly" in out, out
    rows, accum = oracle(16, 2, dp)
    shown = f"{min(rows)}-{max(rows)}" if min(rows) != max(rows) else str(rows[0])
    assert f"batch: global_batch 16 = dp {dp} x {shown} rows, grad accumulation {accum} x" in out, out


def test_the_cp_ranks_of_a_dp_rank_share_its_rows():
    """With parallel.cp the batch splits over dp alone: 8 ranks at cp=2 are dp=4, each dp rank's cp ranks taking the
    same rows (each its chunks of every sequence)."""
    from hpc.trainer_job import batch_note

    tiny = str(ROOT / "train" / "configs" / "tiny.yaml")
    for cp, global_batch, dp in ((2, 8, 4), (4, 6, 2), (1, 6, 8)):
        cfg = load_config(tiny, [f"parallel.cp={cp}", f"global_batch={global_batch}"])
        dims = ParallelDims.build(cfg.parallel, WorldEnv(0, 0, 8, 8), cfg.model.kv_heads())
        split = dims.batch_split(cfg.global_batch, cfg.micro_batch)
        rows, accum = oracle(global_batch, cfg.micro_batch, dp)
        assert dims.dp == dp and [split.share(r)[1] for r in range(dp)] == rows and split.accum == accum
        note = batch_note(cfg, 8, 8)
        assert (note is None) == (global_batch % dp == 0), note
        if note:
            assert f"over dp={dp}:" in note and "\n" not in note, note
