"""No mistake or fault costs a run its checkpoints, through the real `python -m train` on CPU: a resubmission with
other settings is refused in one line with nothing renamed; a load that fails for another reason than damage (an
injected out-of-memory error) fails the start with nothing set aside; a damaged checkpoint is set aside and the older
one loads; when nothing loads, only checkpoint.restart=fresh starts over; one live run per checkpoint directory; a
model.path whose safetensors do not fit its config.json is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file, save_file
from train_helpers import ROOT, clean_env, kill_torchrun, metrics, save_tiny_hf, start_endless, train_cmd

from hpc.node.contract import EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED, EXIT_STOPPED, LEASE_FILE
from train.checkpoint import step_dir

SAVED = ("steps=6", "checkpoint.interval=3", "checkpoint.keep_last=5", "schedule.warmup_steps=2")


def run(run_dir, *overrides, timeout=240, **env):
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        train_cmd(1, f"log.dir={run_dir}", *overrides),
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def listing(run_dir) -> dict[str, int]:
    """Every file under the run directory with its size (what a refused start must leave as it was)."""
    return {str(p.relative_to(run_dir)): p.stat().st_size for p in sorted(run_dir.rglob("*")) if p.is_file()}


def error_lines(r) -> list[str]:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return [line for line in r.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run that saved steps 3 and 6, and its metrics."""
    run_dir = tmp_path_factory.mktemp("saved") / "r"
    r = run(run_dir, *SAVED)
    assert r.returncode == EXIT_DONE, r.stderr[-2000:]
    return run_dir


def copy_run(saved, tmp_path):
    import shutil

    shutil.copytree(saved, tmp_path / "r")
    return tmp_path / "r"


def test_a_resubmission_with_other_settings_is_refused_with_nothing_renamed_and_resumes_once_they_are_back(
    saved, tmp_path
):
    run_dir = copy_run(saved, tmp_path)
    before = listing(run_dir)
    changed = run(run_dir, *SAVED[1:], "steps=9", "model.dims.hidden_size=128", "master_dtype=bf16")
    assert changed.returncode == EXIT_BAD_INPUT, changed.stdout[-2000:] + changed.stderr[-2000:]
    [line] = error_lines(changed)
    assert line.startswith(
        f"train: error: checkpoint.dir {run_dir / 'checkpoints'}: step-00000006 was written with other settings:"
    )
    assert 'master_dtype "fp32" (saved) vs "bf16" (now); model.dims.hidden_size 64 (saved) vs 128 (now)' in line
    assert "checkpoint.restart=fresh" in line
    assert listing(run_dir) == before  # nothing renamed, trimmed or written
    back = run(run_dir, *SAVED[1:], "steps=9")
    assert back.returncode == EXIT_DONE, back.stderr[-2000:]
    assert f"resumed from {step_dir(run_dir / 'checkpoints', 6)} (step 6" in back.stdout
    assert sorted(metrics(run_dir)) == list(range(1, 10))


def test_a_load_that_fails_for_another_reason_than_damage_sets_nothing_aside(saved, tmp_path):
    """An out-of-memory error injected into the checkpoint load (a sitecustomize that replaces DCP's load)."""
    run_dir = copy_run(saved, tmp_path)
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import torch, torch.distributed.checkpoint as dcp\n"
        "def load(*a, **k):\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB (injected)')\n"
        "dcp.load = load\n"
    )
    before = listing(run_dir)
    r = run(run_dir, *SAVED[1:], "steps=9", PYTHONPATH=f"{inject}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert r.returncode == EXIT_FAILED, r.stdout[-2000:] + r.stderr[-2000:]
    [line] = error_lines(r)
    assert "OutOfMemoryError" in line and "nothing was set aside, a later start tries again" in line
    assert listing(run_dir) == before
    again = run(run_dir, *SAVED[1:], "steps=9")  # the requeue: the same checkpoint loads
    assert again.returncode == EXIT_DONE and "(step 6" in again.stdout, again.stderr[-2000:]


@pytest.mark.parametrize("damage", ["truncated shard", "altered bytes"])
def test_a_damaged_checkpoint_is_set_aside_and_the_older_one_loads(saved, tmp_path, damage):
    run_dir = copy_run(saved, tmp_path)
    original = metrics(run_dir)
    shard = next(step_dir(run_dir / "checkpoints", 6).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    if damage == "truncated shard":
        shard.write_bytes(data[: len(data) // 2])
    else:
        data[len(data) // 2] ^= 0xFF  # same size: only the CRC-32 tells
        shard.write_bytes(data)
    again = run(run_dir, *SAVED[1:], "steps=6")
    assert again.returncode == EXIT_DONE, again.stderr[-2000:]
    assert f"resumed from {step_dir(run_dir / 'checkpoints', 3)} (step 3" in again.stdout
    aside = [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-00000006.bad-")]
    assert len(aside) == 1 and (aside[0] / "WHY.txt").is_file()
    assert ("has" in (aside[0] / "WHY.txt").read_text()) == (damage == "truncated shard")
    redone = metrics(run_dir)
    assert [redone[s]["loss"] for s in (4, 5, 6)] == [original[s]["loss"] for s in (4, 5, 6)]


def test_when_nothing_loads_only_a_fresh_restart_trains_from_step_0(saved, tmp_path):
    run_dir = copy_run(saved, tmp_path)
    for step in (3, 6):
        shard = next(step_dir(run_dir / "checkpoints", step).glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
    first = run(run_dir, *SAVED)
    assert first.returncode == EXIT_BAD_INPUT, first.stderr[-2000:]
    assert (
        "were set aside as damaged" in error_lines(first)[-1] and "checkpoint.restart=fresh" in error_lines(first)[-1]
    )
    assert sorted(metrics(run_dir)) == list(range(1, 7))  # metrics.jsonl is not emptied
    fresh = run(run_dir, *SAVED, "checkpoint.restart=fresh")
    assert fresh.returncode == EXIT_DONE, fresh.stderr[-2000:]
    assert "checkpoint.restart=fresh: moved 2 checkpoint(s) to" in fresh.stdout
    archived = list((run_dir / "checkpoints").glob("before-fresh-*/step-*"))
    assert len(archived) == 2 and list(run_dir.glob("metrics.jsonl.before-fresh-*"))
    assert sorted(metrics(run_dir)) == list(range(1, 7))


def test_a_second_run_in_a_live_run_s_checkpoint_directory_is_refused(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    with (run_dir / "out.log").open("w") as out:
        first = start_endless(run_dir, out)
        try:
            deadline = time.time() + 120
            while not (run_dir / "metrics.jsonl").exists():
                assert first.poll() is None and time.time() < deadline, (run_dir / "out.log").read_text()[-2000:]
                time.sleep(0.2)
            holder = json.loads((run_dir / "checkpoints" / LEASE_FILE).read_text())
            second = run(run_dir, "steps=6")
            assert second.returncode == EXIT_BAD_INPUT, second.stderr[-2000:]
            [line] = error_lines(second)
            assert "is in use by a run 'unnamed run of" in line and f"(pid {holder['pid']}," in line
            # refused before the trainer was built: no line of it but the file python -m train resolved
            assert [x for x in second.stdout.splitlines() if x.startswith("[train]")] == [
                x for x in second.stdout.splitlines() if x.startswith("[train] trainer: ")
            ]
            os.kill(first.pid, signal.SIGUSR2)
            assert first.wait(timeout=60) == EXIT_STOPPED
        finally:
            first.kill()
    assert not (run_dir / "checkpoints" / LEASE_FILE).exists()  # released at the end


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return save_tiny_hf(tmp_path_factory.mktemp("hf") / "qwen3")


@pytest.mark.parametrize("fault", ["a tensor missing", "a wrong shape"])
def test_a_model_path_whose_safetensors_do_not_fit_its_config_is_one_line(hf_dir, tmp_path, fault):
    import shutil

    bad = tmp_path / "hf"
    shutil.copytree(hf_dir, bad)
    state = load_file(bad / "model.safetensors")
    if fault == "a tensor missing":
        del state["model.layers.1.mlp.up_proj.weight"]
        want = "1 tensor(s) missing (model.layers.1.mlp.up_proj.weight)"
    else:
        state["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(64, 32)
        want = "model.layers.0.self_attn.o_proj.weight is [64, 32], config.json needs [64, 64]"
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    r = run(tmp_path / "r", "model.shape=null", f"model.path={bad}", "steps=2", "schedule.warmup_steps=1")
    assert r.returncode == EXIT_BAD_INPUT, r.stderr[-2000:]
    [line] = error_lines(r)
    assert line == f"train: error: model.path: {bad}: its safetensors do not fit its config.json: {want}"
    assert not list((tmp_path / "r").glob("checkpoints/step-*")) and not (tmp_path / "r" / "metrics.jsonl").exists()


def test_every_process_group_of_the_trainer_is_bounded_by_the_dist_timeout(tmp_path):
    """dp2 x tp2 on 4 processes: the world, mesh, stop and writer groups all carry HPC_DIST_TIMEOUT_S; one rank
    stopped with SIGSTOP ends the run within that timeout plus torchrun's grace and a margin."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(
        "import json, os\n"
        "def report():\n"
        "    import torch.distributed as dist, torch.distributed.distributed_c10d as c10d\n"
        "    if not dist.is_initialized(): return\n"
        "    out = {}\n"
        "    for pg in list(c10d._world.pg_map):\n"
        "        backend = pg._get_backend(__import__('torch').device('cpu'))\n"
        "        out[c10d._world.pg_names.get(pg, '?')] = backend.options._timeout.total_seconds()\n"
        "    open(os.environ['PROBE_OUT'] + f\".{os.environ['RANK']}\", 'w').write(json.dumps(out))\n"
        "import train.loop as loop\n"
        "orig = loop.Trainer.run\n"
        "def run(self, *a, **k):\n    report()\n    return orig(self, *a, **k)\n"
        "loop.Trainer.run = run\n"
    )
    env = clean_env(
        HPC_DIST_TIMEOUT_S="20",
        PROBE_OUT=str(tmp_path / "groups"),
        PYTHONPATH=f"{probe}{os.pathsep}{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    with (run_dir / "out.log").open("w") as out:
        proc = subprocess.Popen(
            train_cmd(
                4,
                f"log.dir={run_dir}",
                "parallel.tp=2",
                "steps=100000",
                "log.log_every=100000",
                "checkpoint.async_save=true",
            ),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.time() + 240
            while not (run_dir / "metrics.jsonl").exists() or len(metrics(run_dir)) < 2:
                assert proc.poll() is None and time.time() < deadline, (run_dir / "out.log").read_text()[-3000:]
                time.sleep(0.2)
            groups = [json.loads((tmp_path / f"groups.{r}").read_text()) for r in range(4)]
            ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            victim = max(int(p) for p in ranks)  # a rank: a child of torchrun's launcher
            os.kill(victim, signal.SIGSTOP)
            t0 = time.time()
            rc = proc.wait(timeout=180)
            ended = time.time() - t0
        finally:
            kill_torchrun(proc)  # the stopped rank too, if torchrun has not ended it
    for r, by_name in enumerate(groups):
        assert len(by_name) >= 4, by_name  # world, dp, tp, the stop flag's and the writer's
        assert set(by_name.values()) == {20.0}, (r, by_name)
    assert rc != 0
    assert ended < 20 + 30 + 40, ended  # the timeout, torchrun's 30 s before it SIGKILLs the stopped rank, a margin
    print(f"\n[timeout] {len(groups[0])} groups per rank bounded at 20 s; the run ended {ended:.1f} s after SIGSTOP")
