"""LoRA and QLoRA on one GPU: the trainer's memory settings against transformers + Liger + peft, same invocation.

    python bench/lora_bench.py [--cases NAME ...] [--out FILE]

Qwen3-8B dims (vocab 151936), random weights, seq 4096, LoRA r 16 alpha 32 on q, k, v, o, gate, up, down, bf16 base,
fp32 adapters and AdamW state (fused), gradient clipping. Cases (each in its own process, the GPU to itself):
  ours-b2          the trainer, micro-batch 2, no activation checkpointing, compiled layers
  ours-b4-ac       micro-batch 4, every layer checkpointed
  ours-b4-offload  micro-batch 4, every layer checkpointed, its input in host memory (activation_offload)
  ours-b8-offload  micro-batch 8, the same
  peft-b1          transformers' Qwen3ForCausalLM (bf16) + Liger (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy) +
  peft
  qlora-32B        Qwen3-32B with an NF4 base, micro-batch 1, checkpointed (start-up and peak)
  qlora-70B        a 70B-class dense shape (hidden 8192, 80 layers, intermediate 28672, 64 heads, 8 KV heads), NF4
Timed steps follow warm-up steps (compilation); tokens/s over the timed steps; peak = the GPU's max allocated memory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from one_gpu import one_rank_trainer, peft_peer, timed

ROOT = Path(__file__).resolve().parent.parent

SEQ, WARMUP, TIMED = 4096, 3, 6
LORA = {
    "enabled": True,
    "r": 16,
    "alpha": 32,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
VOCAB = {"vocab_size": 151936}
SEVENTY_B = {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
# name: (shape, dims, micro-batch, trainer settings); peft-b1 is the peer
CASES = {
    "ours-b2": ("8B", VOCAB, 2, {}),
    "ours-b4-ac": ("8B", VOCAB, 4, {"activation_checkpointing": True}),
    "ours-b4-offload": ("8B", VOCAB, 4, {"activation_checkpointing": True, "activation_offload": True}),
    "ours-b8-offload": ("8B", VOCAB, 8, {"activation_checkpointing": True, "activation_offload": True}),
    "peft-b1": ("8B", VOCAB, 1, {}),
    "qlora-32B": ("32B", VOCAB, 1, {"activation_checkpointing": True, "quantize": True}),
    "qlora-70B": ("32B", VOCAB | SEVENTY_B, 1, {"activation_checkpointing": True, "quantize": True}),
}


def _config(name: str, run_dir: str):
    from train.front.config import TrainConfig

    shape, dims, batch, extra = CASES[name]
    extra = dict(extra)
    lora = dict(LORA, quantize_base="nf4" if extra.pop("quantize", False) else "none")
    steps = WARMUP + TIMED
    return TrainConfig(
        model={"shape": shape, "dims": dims},
        seq_len=SEQ,
        micro_batch=batch,
        global_batch=batch,
        steps=steps,
        compile=not lora["quantize_base"] == "nf4",
        lora=lora,
        optim={"lr": 1e-4},
        schedule={"warmup_steps": 0},
        log={"dir": run_dir, "log_every": 1000},
        checkpoint={"dir": f"{run_dir}/checkpoints"},
        **extra,
    )


def _ours(cfg) -> dict:
    trainer, startup = one_rank_trainer(cfg)
    losses = []
    seconds, warm = timed(lambda: losses.append(trainer.train_step()["loss"]), WARMUP, TIMED)
    return {"seconds": seconds, "warmup_s": warm, "startup_s": startup, "loss": float(losses[-1])}


def _peft(cfg) -> dict:
    step, startup, losses = peft_peer(cfg, LORA)
    seconds, warm = timed(step, WARMUP, TIMED)
    return {"seconds": seconds, "warmup_s": warm, "startup_s": startup, "loss": float(losses[-1])}


def _one(name: str) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = _config(name, run_dir)
        out = _peft(cfg) if name.startswith("peft") else _ours(cfg)
    return out | {
        "case": name,
        "micro_batch": cfg.micro_batch,
        "tokens_per_s": TIMED * cfg.micro_batch * SEQ / out["seconds"],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "gpu": torch.cuda.get_device_name(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=[c for c in CASES if not c.startswith("qlora")])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(_one(a.one)), flush=True)
        os._exit(0)
    rows = []
    for name in a.cases:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, cwd=ROOT)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            rows.append({"case": name, "error": tail[-1][:300] if tail else f"exit {proc.returncode}"})
            print(
                f"{name}: failed ({time.perf_counter() - t0:.0f} s): {rows[-1]['error']}\n{proc.stderr[-2500:]}",
                flush=True,
            )
            continue
        rows.append(json.loads(line[len("RESULT ") :]))
        r = rows[-1]
        print(
            f"{name}: {r['tokens_per_s']:,.0f} tok/s, peak {r['peak_gib']:.1f} GiB, start-up {r['startup_s']:.0f} s, "
            f"warm-up {r['warmup_s']:.0f} s, loss {r['loss']:.3f} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    gpu = next((r["gpu"] for r in rows if "gpu" in r), "?")
    peer = next((r for r in rows if r["case"] == "peft-b1" and "error" not in r), None)
    print(f"\nQwen3-8B LoRA r16 (seven projections), seq {SEQ}, one {gpu}")
    print(f"{'case':<16} {'batch':>5} {'tok/s':>8} {'vs peft':>8} {'peak GiB':>9} {'tok/s/GiB':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<16} failed: {r['error']}")
            continue
        vs = f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer else "-"
        print(
            f"{r['case']:<16} {r['micro_batch']:>5} {r['tokens_per_s']:>8,.0f} {vs:>8} {r['peak_gib']:>9.1f} "
            f"{r['tokens_per_s'] / r['peak_gib']:>10,.0f}"
        )
    out = Path(a.out or ROOT / "bench" / "results" / f"{datetime.date.today()}-lora.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seq": SEQ, "warmup": WARMUP, "timed": TIMED, "gpu": gpu, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
