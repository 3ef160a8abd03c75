"""Launch the real trainer entry point (`python -m train`, alone or under torchrun) and read what it wrote
(metrics, tracker records)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "train" / "configs" / "tiny.yaml"
# torchao lives apart from the venv (scripts/install.sh puts it in .extras/fp8): installed there, it would print
# warnings in every process of the suite that imports transformers. HPC_TEST_TORCHAO names another folder
# (scripts/test.sh
# latest: the newest torchao the fp8 extra allows).
FP8_SITE = Path(os.environ.get("HPC_TEST_TORCHAO") or ROOT / ".extras" / "fp8")
REPEATABLE = ("loss", "grad_norm", "lr", "epoch", "samples_consumed")  # metrics equal bit for bit after a resume (CPU)
_DIST_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "ROLE_RANK",
)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any inherited rank variables, one thread per process, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra)
    return env


def train_cmd(nproc: int, *overrides: str, config: Path = TINY) -> list[str]:
    """`python -m train` for one process, `torchrun --standalone` for several."""
    launcher = (
        [sys.executable]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    )
    return [*launcher, "-m", "train", "--config", str(config), *overrides]


def launch(nproc: int, run_dir: Path, *overrides: str) -> subprocess.Popen:
    """Start a training run writing to ``run_dir`` (output in run_dir/launch.log); pair with ``finish``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / "launch.log").open("w")
    return subprocess.Popen(
        train_cmd(nproc, f"log.dir={run_dir}", *overrides),
        cwd=ROOT,
        env=clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> str:
    """Wait for a launched run; fail with its output tail unless it exited 0. Returns its output."""
    rc = proc.wait(timeout=timeout)
    out = (run_dir / "launch.log").read_text()
    assert rc == 0, f"training run in {run_dir} exited {rc}:\n{out[-4000:]}"
    return out


def metrics(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl records by step (the last record wins if a step was logged twice)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


def seed_checkpoint(src_run: Path, step: int, dst_run: Path) -> None:
    """Copy src_run's complete checkpoint of ``step`` into dst_run, so a run there resumes from it."""
    name = f"step-{step:08d}"
    shutil.copytree(src_run / "checkpoints" / name, dst_run / "checkpoints" / name)


def tiny_hf_chat(out: Path, rows: int = 64) -> tuple[Path, Path]:
    """A tiny float32 Qwen3 directory with the demo chat tokenizer, and ``rows`` chat records of the demo set beside it:
    (model directory, data file) for scripts of a user's own (Trainer, TRL, accelerate)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from train.data.tokenizer import load_tokenizer
    from train.front.data_sources import DEMO_CHAT
    from train.front.tokenizer import DEMO_CHAT_TOKENIZER_DIR

    model, data = out / "qwen3-tiny", out / "chat.jsonl"
    tok = load_tokenizer(str(DEMO_CHAT_TOKENIZER_DIR))
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(model)
    tok.save_pretrained(model)
    with DEMO_CHAT.open() as f:
        data.write_text("".join(next(f) for _ in range(rows)))
    return model, data


def save_tiny_hf(out: Path, seed: int = 0) -> Path:
    """A tiny random Qwen3 (fp32) with the demo tokenizer as a local Hugging Face directory."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from train.data.tokenizer import load_tokenizer
    from train.front.tokenizer import DEMO_TOKENIZER_DIR

    config = Qwen3Config(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(out)
    load_tokenizer(str(DEMO_TOKENIZER_DIR)).save_pretrained(out)
    return out


def start_endless(run_dir: Path, out, **env: str) -> subprocess.Popen:
    """A one-process run that would train for ever and logs rarely (stop it with the pre-stop signal)."""
    return subprocess.Popen(
        train_cmd(1, f"log.dir={run_dir}", "steps=100000", "log.log_every=100000"),
        cwd=ROOT,
        env=clean_env(**env),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )


def kill_torchrun(proc: subprocess.Popen) -> None:
    """SIGKILL a torchrun started with ``start_new_session`` and every rank it started: torchrun starts its ranks in
    sessions of their own, so a stopped or frozen rank would outlive its launcher's process group."""
    ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    proc.wait()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def items(update) -> dict:
    """A W&B record's items (key, or nested key, and JSON value) as a dict."""
    return {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in update}


def logged(records: dict[int, dict]) -> dict[str, dict[int, float]]:
    """What a tracker receives of metrics.jsonl: {key: {step: value}} of the numeric values but the step."""
    out: dict[str, dict[int, float]] = {}
    for step, record in records.items():
        for k, v in record.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(k, {})[step] = float(v)
    return out
