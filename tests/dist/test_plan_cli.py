"""Layout planner: Qwen3 sizes, the memory model's choices, the CLI and hpc.login.submit's use of it."""

from conftest import ROOT, run_cli

# the model cards' totals and non-embedding counts, in billions


def test_cli():
    r = run_cli("-m", "hpc.login.plan", "--site", "ib-h200", "--nodes", "4", "--model", "14B", "--seq-len", "8192", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "plan for Qwen3-14B on site ib-h200, partition gpu: 4 node(s) x 8 GPU(s) of 141 GB, 8192 tokens" in r.stdout
    assert "proposal: dp=32 x tp=1" in r.stdout



def test_a_cli_error_is_one_line_exit_2():
    """The process's side of the contract; the messages are checked in process (tests/bad_input_cases.py)."""
    r = run_cli("-m", "hpc.login.plan", "--site", "ib-h200", "--nodes", "2", "--model", "9B", timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("hpc.login.plan: error: --model 9B: allowed"), r.stderr



def test_submit_adds_the_plan_on_gpu_sites_only(tmp_path):
    tiny = str(ROOT / "hpc" / "train" / "configs" / "tiny.yaml")
    r = run_cli("-m", "hpc.login.submit", "--site", "ib-h200", "--nodes", "2", "--dry-run", "--", "--config", tiny, "global_batch=32",
                cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "planner: dp=16 x tp=1" in r.stderr and f"--config {tiny} global_batch=32 parallel.tp=1" in r.stdout
    r = run_cli("-m", "hpc.login.submit", "--site", "local", "--nodes", "2", "--dry-run", "--", "--config", tiny,
                cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "parallel.tp" not in r.stdout and "planner" not in r.stderr
