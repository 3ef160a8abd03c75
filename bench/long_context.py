"""Long context on one GPU: Qwen3-8B LoRA at 32k-128k tokens per sample, the trainer against transformers + Liger +
peft, each case in a process of its own; a gradient check of the trainer's memory settings against an unchunked
reference; a memory model fitted to the runs.

    python bench/long_context.py [--cases ours:32768 ours:131072 peft:32768 ...] [--grad-check 32768] [--out FILE]

A case is SIDE:LENGTH. ``ours``: the trainer, LoRA r16 alpha 32 on q, k, v, o, gate, up, down over a bf16 base,
micro-batch 1 of LENGTH tokens of the shipped text corpus, every layer checkpointed with its input in host memory
(activation_offload), the MLPs in checkpointed tiles of 8192 tokens (tiled_mlp), the fused chunked cross-entropy,
compiled layers; ``ours-untiled`` the same without tiled_mlp. ``peft``: transformers' Qwen3ForCausalLM +
Liger (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy) + peft with the same adapters and transformers' gradient
checkpointing. RoPE runs past the native 40,960 positions (max_position_embeddings = LENGTH): with random weights
the scaling changes no cost. Each case: 1 warm-up + 2 timed full optimizer steps
(``LONG_CONTEXT_TIMED_STEPS``), a finite loss, the GPU's peak
allocated memory and the process's peak resident host memory.

``--grad-check L`` builds the trainer's model twice from one seed with 4 layers of the 8B shape: once with the long
context settings (checkpointing, offload, tiled MLP, chunked loss), once with none of them and the loss from the full
[L x vocab] logits; it reports the relative difference of every adapter gradient.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from one_gpu import one_rank_trainer, peft_peer, timed

ROOT = Path(__file__).resolve().parent.parent

WARMUP = 1
TIMED = int(os.environ.get("LONG_CONTEXT_TIMED_STEPS", "2"))
LORA = {
    "enabled": True,
    "r": 16,
    "alpha": 32,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


TILE = 8192  # tiled_mlp's tokens per tile


def _config(length: int, run_dir: str, layers: int | None = None, long_settings: bool = True, tiled: bool = True):
    from train.front.config import TrainConfig

    dims = {"vocab_size": 151936, "max_position_embeddings": max(length, 40960)}
    if layers:
        dims["num_hidden_layers"] = layers
    extra = {"activation_checkpointing": True, "activation_offload": True} if long_settings else {}
    if long_settings and tiled:
        extra["tiled_mlp"] = TILE
    return TrainConfig(
        model={"shape": "8B", "dims": dims},
        seq_len=length,
        micro_batch=1,
        global_batch=1,
        steps=WARMUP + TIMED,
        compile=long_settings,
        lora=LORA,
        optim={"lr": 1e-4},
        schedule={"warmup_steps": 0},
        log={"dir": run_dir, "log_every": 1000},
        checkpoint={"dir": f"{run_dir}/checkpoints"},
        **extra,
    )


def _host_peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _ours(length: int, run_dir: str, tiled: bool = True) -> dict:
    trainer, startup = one_rank_trainer(_config(length, run_dir, tiled=tiled))
    losses = []
    seconds, warm = timed(lambda: losses.append(float(trainer.train_step()["loss"])), WARMUP, TIMED)
    return {"seconds": seconds, "warmup_s": warm, "startup_s": startup, "losses": losses}


def _peft(length: int, run_dir: str) -> dict:
    step, startup, losses = peft_peer(_config(length, run_dir), LORA, checkpointing=True)
    seconds, warm = timed(step, WARMUP, TIMED)
    return {"seconds": seconds, "warmup_s": warm, "startup_s": startup, "losses": [float(x) for x in losses]}


def _grad_part(which: str, length: int, run_dir: str, out: str) -> dict:
    """One side of the gradient check: the adapter gradients of the first micro-batch, saved to ``out``."""
    import torch
    import torch.nn.functional as F

    from train.loss import IGNORE

    long_settings = which == "long"
    trainer, _ = one_rank_trainer(_config(length, run_dir, layers=4, long_settings=long_settings))
    ((x, labels),) = trainer.stream.next_microbatches()
    x, labels = x.cuda(), labels.cuda()
    if long_settings:
        loss = trainer.model(input_ids=x, labels=labels, reduction="sum")
    else:
        logits = trainer.model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        del logits
    loss.backward()
    grads = {n: p.grad.detach().float().cpu() for n, p in trainer.model.named_parameters() if p.grad is not None}
    torch.save(grads, out)
    return {"loss": float(loss), "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def _grad_check(length: int) -> dict:
    """Both sides of the gradient check, each in a process of its own; the relative difference of every nonzero
    adapter gradient (LoRA's B starts at zero, so A's gradients are zero on both sides and are left out)."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        for which in ("long", "reference"):
            proc = subprocess.run(
                [sys.executable, __file__, "--one", f"gradpart:{which}:{length}:{tmp}/{which}.pt"],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                return {"error": f"{which}: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
            sides[which] = json.loads(line[len("RESULT ") :])
        long, ref = torch.load(f"{tmp}/long.pt"), torch.load(f"{tmp}/reference.pt")
    rel = {n: float((long[n] - g).norm() / g.norm()) for n, g in ref.items() if g.norm() > 0}
    return {
        "length": length,
        "layers": 4,
        "tensors": len(rel),
        "max_rel_diff": max(rel.values()),
        "median_rel_diff": sorted(rel.values())[len(rel) // 2],
        "loss_long": sides["long"]["loss"],
        "loss_reference": sides["reference"]["loss"],
        "peak_gib_long": sides["long"]["peak_gib"],
        "peak_gib_reference": sides["reference"]["peak_gib"],
    }


def _one(case: str) -> dict:
    import torch

    side, length, *rest = case.split(":")
    with tempfile.TemporaryDirectory() as run_dir:
        if side == "gradpart":
            return _grad_part(length, int(rest[0]), run_dir, rest[1])
        if side == "peft":
            out = _peft(int(length), run_dir)
        else:
            out = _ours(int(length), run_dir, tiled=side == "ours")
    return out | {
        "case": case,
        "side": side,
        "length": int(length),
        "tokens_per_s": TIMED * int(length) / out["seconds"],
        "finite": all(math.isfinite(v) for v in out["losses"]),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "host_peak_gib": _host_peak_gib(),
        "gpu": torch.cuda.get_device_name(),
    }


def fit(rows: list[dict], key: str) -> tuple[float, float]:
    """Least-squares line key = a + b x length (GiB against tokens) over the rows that ran."""
    pts = [(r["length"], r[key]) for r in rows if key in r]
    n = len(pts)
    mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
    b = sum((x - mx) * (y - my) for x, y in pts) / max(sum((x - mx) ** 2 for x, _ in pts), 1e-9)
    return my - b * mx, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="*", default=["ours:32768", "ours:65536", "ours:131072", "peft:32768"])
    ap.add_argument("--grad-check", type=int, metavar="LENGTH")
    ap.add_argument("--gpu-gib", type=float, default=79.0, help="the card's memory for the predicted maximum")
    ap.add_argument("--host-gib", type=float, default=120.0, help="the host's memory for the predicted maximum")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(_one(a.one)), flush=True)
        os._exit(0)
    rows = []
    if a.grad_check:
        rows.append(_grad_check(a.grad_check) | {"case": f"grad:{a.grad_check}"})
        print(json.dumps(rows[-1]), flush=True)
    cases = list(a.cases)
    for case in cases:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True, text=True, cwd=ROOT)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            rows.append({"case": case, "error": tail[-1][:300] if tail else f"exit {proc.returncode}"})
            print(f"{case}: failed ({time.perf_counter() - t0:.0f} s): {rows[-1]['error']}", flush=True)
            continue
        rows.append(json.loads(line[len("RESULT ") :]) | {"wall_s": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)
    ours = [r for r in rows if r.get("side") == "ours" and "peak_gib" in r]
    report = {"rows": rows}
    if len(ours) >= 2:
        (ga, gb), (ha, hb) = fit(ours, "peak_gib"), fit(ours, "host_peak_gib")
        report["memory_model"] = {
            "gpu_gib": [ga, gb * 1e3],
            "host_gib": [ha, hb * 1e3],
            "units": "GiB = a + b x thousands of tokens",
            "max_tokens_gpu": int((a.gpu_gib - ga) / gb) if gb > 0 else None,
            "max_tokens_host": int((a.host_gib - ha) / hb) if hb > 0 else None,
        }
        print(json.dumps(report["memory_model"]), flush=True)
    print(f"\nQwen3-8B LoRA r16, micro-batch 1, one {next((r['gpu'] for r in rows if 'gpu' in r), '?')}")
    print(f"{'case':<14} {'tok/s':>8} {'peak GiB':>9} {'host GiB':>9} {'loss':>7}")
    for r in rows:
        if "tokens_per_s" in r:
            print(
                f"{r['case']:<14} {r['tokens_per_s']:>8,.0f} {r['peak_gib']:>9.1f} {r['host_peak_gib']:>9.1f} "
                f"{r['losses'][-1]:>7.3f}"
            )
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
