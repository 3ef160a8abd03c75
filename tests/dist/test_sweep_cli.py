"""Sweeps and chains as processes: the case table under bash; a bad sweep is one line, exit 2 (the other bad sweeps
and the dry run's task table are checked in process: tests/bad_input_cases.py, tests/unit/test_sweep_spec.py)."""

import subprocess

from conftest import run_cli
from login_helpers import sweep_spec

from hpc.render import render_sbatch


def test_the_case_table_gives_each_task_its_overrides_quoted(monkeypatch, tmp_path):
    hostile = "a b;$(touch /tmp/owned)'\""
    text = render_sbatch(sweep_spec(monkeypatch, "optim.lr=1e-4,3e-4", f"run.tag=x,{hostile}", after=("7:any", "8")))
    assert "#SBATCH --array=0-3\n" in text and "#SBATCH --dependency=afterany:7,afterok:8\n" in text
    assert "#SBATCH --output=/home/alice/project/jobs/lr/%A_%a_0_log.out" in text
    (tmp_path / "job.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    table = text[text.index('case "${SLURM_ARRAY_TASK_ID') : text.index("esac") + 4]
    show = '; printf "%s\\n" "${task_args[@]}" "$HPC_JOB_NAME"'
    out = subprocess.run(
        ["bash", "-c", table + show], env={"SLURM_ARRAY_TASK_ID": "3"}, capture_output=True, text=True
    ).stdout
    d = "3-optim.lr=3e-4_run.tag=a_b_touch_tmp_owned"
    assert out.splitlines() == [
        "optim.lr=3e-4",
        f"run.tag={hostile}",
        f"log.dir=/home/alice/project/jobs/lr/{d}",
        f"checkpoint.dir=/home/alice/project/checkpoints/lr/{d}",
        f"lr[3] optim.lr=3e-4 run.tag={hostile}",
    ]
    unknown = subprocess.run(["bash", "-c", table], env={"SLURM_ARRAY_TASK_ID": "4"}, capture_output=True, text=True)
    assert unknown.returncode == 2 and "array task '4' is not in this sweep (0-3)" in unknown.stderr
    assert 'scontrol requeue "$job_ref"' in text and 'job_ref="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in text


def test_a_sweep_of_a_non_trainer_command_is_refused(tmp_path):
    r = run_cli(
        "-m",
        "hpc.submit",
        "--site",
        "local",
        "--nodes",
        "1",
        "--sweep",
        "seed=1,2",
        "--dry-run",
        "--",
        "-m",
        "hpc.node.smoke",
        cwd=tmp_path,
    )
    assert (
        r.returncode == 2
        and r.stderr.strip()
        == "hpc.submit: error: --sweep: sweeps trainer overrides; -m hpc.node.smoke is not the trainer"
    )
