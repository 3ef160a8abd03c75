"""Sweeps and chains at submit time: the task table, the rendered array script, and bad input (one line, exit 2)."""

import json
import re

import pytest
from train_helpers import TINY

from hpc.dependency import DependencyError, parse_after
from hpc.node.contract import METRICS_FILE
from hpc.slurm_query import Job, expand_indices
from hpc.sweep import SweepError, build_sweep, split_values, write_table
from hpc.sweep_report import sweep_table, task_runs


def test_tasks_are_the_cartesian_product_in_order():
    sweep = build_sweep(["optim.lr=1e-4,3e-4", "micro_batch=2,4", "optim.betas=[0.9,0.95],[0.9,0.99]"], 3)
    assert len(sweep.tasks) == 8 and sweep.array == "0-7%3"
    assert sweep.tasks[0].overrides == ("optim.lr=1e-4", "micro_batch=2", "optim.betas=[0.9,0.95]")
    assert sweep.tasks[7].overrides == ("optim.lr=3e-4", "micro_batch=4", "optim.betas=[0.9,0.99]")
    assert sweep.tasks[5].dir_name == "5-optim.lr=3e-4_micro_batch=2_optim.betas=_0.9_0.99"
    assert len({t.dir_name for t in sweep.tasks}) == 8
    assert build_sweep([], None) is None
    assert build_sweep(["seed=1,2,3,4,5,6,7,8,9,10,11"], None).tasks[3].dir_name == "03-seed=4"
    assert split_values("[1,2],{a: 1, b: 2},x") == ["[1,2]", "{a: 1, b: 2}", "x"]


@pytest.mark.parametrize(
    "items,max_parallel,message",
    [
        (["optim.lr="], None, "an empty value"),
        (["optim.lr=1,,2"], None, "an empty value"),
        (["optim.lr=1", "optim.lr=2"], None, "given twice"),
        (["optim.lr=1,1"], None, "a value is repeated"),
        (["lr 1,2"], None, "expected KEY=V1,V2"),
        (["log.dir=a,b"], None, "each task gets its own log.dir"),
        ([], 2, "give it with --sweep"),
        (["seed=1,2"], 0, "--max-parallel 0: must be at least 1"),
    ],
)
def test_bad_sweep(items, max_parallel, message):
    with pytest.raises(SweepError, match=re.escape(message)):
        build_sweep(items, max_parallel)


def test_after_kinds_and_bad_after():
    assert parse_after(["12", "12:any", "13_4:notok", "12"]) == ("afterok:12", "afterany:12", "afternotok:13_4")
    for bad, message in (
        ("x12", "expected JOB"),
        ("12:maybe", "'maybe' is not one of ok, any, notok"),
        ("", "expected JOB"),
        ("１２", "expected JOB"),
    ):
        with pytest.raises(DependencyError, match=re.escape(message)):
            parse_after([bad])


def test_slurm_index_lists():
    assert expand_indices("3") == [3]
    assert expand_indices("0-3%2") == [0, 1, 2, 3]
    assert expand_indices("[0-2,5]") == [0, 1, 2, 5]


def test_a_different_sweep_under_one_name_is_refused(tmp_path):
    write_table(build_sweep(["seed=1,2"], None), "lr", tmp_path)
    write_table(build_sweep(["seed=1,2"], None), "lr", tmp_path)  # the same sweep again: its tasks resume
    with pytest.raises(SweepError, match="already ran another sweep"):
        write_table(build_sweep(["seed=1,3"], None), "lr", tmp_path)


def test_tasks_sorted_by_final_eval_loss_else_loss(tmp_path):
    write_table(build_sweep(["seed=1,2,3"], None), "s", tmp_path)
    finals = {0: {"loss": 2.0}, 1: {"loss": 3.0, "eval_loss": 1.5}, 2: {"loss": 1.0}}
    for i, last in finals.items():
        run = tmp_path / f"{i}-seed={i + 1}"
        run.mkdir()
        (run / METRICS_FILE).write_text(
            json.dumps({"step": 1, "loss": 9.0}) + "\n" + json.dumps({"step": 2, **last}) + "\n"
        )
    jobs = [
        Job(f"5_{i}", "s", "COMPLETED", 1, "0:10", "debug", "n1", 0, tmp_path / f"5_{i}_0_log.out", i) for i in range(3)
    ]
    runs = task_runs(jobs)
    assert [r.job.job_id for r in runs] == ["5_2", "5_1", "5_0"]
    assert [r.final_loss for r in runs] == [1.0, 1.5, 2.0]
    lines = sweep_table(runs).splitlines()
    assert lines[0].split() == ["TASK", "STATE", "RESTARTS", "OVERRIDES", "STEP", "LOSS", "EVAL_LOSS", "TOKENS/S"]
    assert lines[2].split()[:7] == ["5_1", "COMPLETED", "0", "seed=2", "2", "3", "1.5"]


def test_dry_run_prints_the_script_and_the_task_table(tmp_path, monkeypatch, capsys):
    from hpc.submit import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--site",
                "local",
                "--nodes",
                "1",
                "--job-name",
                "lr",
                "--sweep",
                "optim.lr=1e-4,3e-4",
                "--sweep",
                "micro_batch=1,2",
                "--max-parallel",
                "2",
                "--dry-run",
                "--",
                "--config",
                str(TINY),
            ]
        )
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    assert out.startswith("#!/bin/bash") and "#SBATCH --array=0-3%2\n" in out
    assert f"#   2  optim.lr=3e-4 micro_batch=1  ->  {tmp_path}/jobs/lr/2-optim.lr=3e-4_micro_batch=1" in out
    table = err.splitlines()
    assert table[0] == "4 array tasks (--array=0-3%2):"
    assert table[4].split() == [
        "2",
        "optim.lr=3e-4",
        "micro_batch=1",
        f"{tmp_path}/jobs/lr/2-optim.lr=3e-4_micro_batch=1",
    ]
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing
