"""Where a rank's restart spends its time on a GPU: a fresh process from its start to its second step after a resume.

    python bench/restart_cost.py [--shape 0.6B] [--batch 4] [--seq 4096] [--out FILE.json] [--smoke]

A first process trains two steps of the shape and saves a checkpoint; then, twice, a fresh process (as the restart
program starts one) goes through a rank's start and prints the seconds of each phase: the interpreter, importing
torch, the CUDA context, importing the trainer (transformers with it), the process group (NCCL, one rank), building
the model and optimizer, loading the checkpoint, the first step (compilation included) and the second. The phases
up to the trainer's import are what a process started ahead of the fault (a standby) has already paid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from one_gpu import emit  # bench/, first on sys.path as the script runs

ROOT = Path(__file__).resolve().parent.parent


def _config(shape: str, batch: int, seq: int, run_dir: Path, smoke: bool):
    from train.front.config import TrainConfig

    return TrainConfig(
        model={"shape": shape},
        seq_len=seq,
        micro_batch=batch,
        global_batch=batch,
        steps=1000,
        compile=not smoke,
        log={"dir": str(run_dir)},
        checkpoint={"dir": str(run_dir / "checkpoints"), "keep_last": 1},
    )


def child(args) -> None:
    marks = [("process start", float(args.t0))]

    def mark(what: str) -> None:
        marks.append((what, time.time()))

    mark("interpreter up")
    import torch

    mark("import torch")
    sync = torch.cuda.synchronize if not args.smoke else (lambda: None)
    if not args.smoke:
        torch.empty(1, device="cuda")
        sync()
    mark("CUDA context")
    sys.path.insert(0, str(ROOT))
    from train.checkpoint import complete_checkpoints
    from train.loop import Trainer
    from train.parallel import ParallelDims, WorldEnv, init_distributed

    mark("import the trainer (and transformers)")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29633")
    env = WorldEnv(rank=0, local_rank=0, world_size=1, local_world_size=1)
    device = init_distributed(env)
    mark("process group")
    cfg = _config(args.shape, args.batch, args.seq, Path(args.run_dir), args.smoke)
    dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads())
    trainer = Trainer(cfg, dims, env, device, run_id="restart-cost")
    sync()
    mark("model and optimizer built")
    if args.save:
        for _ in range(2):
            trainer.train_step()
        trainer.save()
        sync()
        mark("two steps and a save")
    else:
        trainer.load(complete_checkpoints(Path(args.run_dir) / "checkpoints")[-1][1])
        sync()
        mark("checkpoint loaded")
        for n in ("first step", "second step"):
            float(trainer.train_step()["loss"])
            sync()
            mark(n)
    phases = [{"phase": w, "s": round(t - marks[i][1], 2)} for i, (w, t) in enumerate(marks[1:])]
    print("RESULT " + json.dumps({"phases": phases, "total_s": round(marks[-1][1] - marks[0][1], 2)}), flush=True)


def run(args, run_dir: str, save: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", "--run-dir", run_dir, "--shape", args.shape]
    cmd += ["--batch", str(args.batch), "--seq", str(args.seq), "--t0", repr(time.time())]
    cmd += ["--smoke"] if args.smoke else []
    p = subprocess.run(cmd + (["--save"] if save else []), capture_output=True, text=True, timeout=900)
    got = [json.loads(x[7:]) for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    return got[0] if got else {"exit": p.returncode, "stderr_tail": p.stderr[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="0.6B")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="the tiny shape on the CPU, uncompiled (the plumbing)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--save", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    ap.add_argument("--t0", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    import torch

    with tempfile.TemporaryDirectory() as run_dir:
        report = {
            "gpu": torch.cuda.get_device_name(0) if not a.smoke else "cpu",
            "torch": torch.__version__,
            "shape": a.shape,
            "tokens_per_step": a.batch * a.seq,
            "first_run": run(a, run_dir, save=True),
            "restarts": [run(a, run_dir, save=False) for _ in range(2)],
        }
    emit(report, a.out)


if __name__ == "__main__":
    main()
