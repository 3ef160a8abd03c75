"""The GPU suite: every GPU path of the trainer against its oracle, in one run on one GPU, with a report.

    python bench/gpu_suite.py [--parts dense lora moe qlora fp8-lora compile tiled-mlp] [--out DIR] [--smoke]
    (or: bash scripts/test.sh gpu [--parts ...])

Parts (each side in its own process, so each has the GPU to itself and its own peak):
  dense     the trainer (one rank: bf16 compute, fp32 master weights) against transformers' Qwen3ForCausalLM (fp32
            parameters under bf16 autocast), from the same Hugging Face directory, data, schedule and clipping
  lora      the trainer's LoRA (r 16 on the seven projections) against peft's on the same base, from the same initial
            adapters (the trainer's, copied into peft), data and schedule
  moe       the trainer's grouped experts against transformers' Qwen3MoeForCausalLM (grouped_mm) from the same
            directory, with the same load-balancing loss, both in bf16 (parameters and AdamW state); both sides'
            tokens per expert of every layer at every step
  qlora     Qwen3-32B with an NF4 base, LoRA and activation checkpointing on one GPU: start-up time, peak, 20 steps
  fp8-lora  LoRA on a float8 base against LoRA on the bf16 base
  compile   the trainer compiled against eager: losses and tokens/s
  tiled-mlp the MLPs in checkpointed tiles (tiled_mlp) against whole sequences, both checkpointed
Each comparison has its stated tolerance (TOLERANCE); the report (DIR/suite.md, DIR/suite.json, DIR/curves.png,
DIR/moe_load.png) says pass or fail per part. --smoke runs the parts with the tiny shapes on the CPU (what the dist
tier checks: the plumbing, the oracles, the report), skipping float8 and compile, which are GPU paths.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from one_gpu import one_rank_trainer

ROOT = Path(__file__).resolve().parent.parent

PARTS = ["dense", "lora", "moe", "qlora", "fp8-lora", "compile", "tiled-mlp"]
SIDES = {
    "dense": ["ours", "hf"],
    "lora": ["ours", "peft"],
    "moe": ["ours", "hf"],
    "qlora": ["ours"],
    "fp8-lora": ["ours", "ours-fp8"],
    "compile": ["ours", "ours-compiled"],
    "tiled-mlp": ["ours", "ours-tiled"],
}
# The runs on a GPU and their --smoke stand-ins on the CPU: shape, dims overrides, seq, micro-batch, steps.
GPU = {
    "dense": ("0.6B", {}, 1024, 4, 100),
    "lora": ("0.6B", {}, 1024, 4, 100),
    "moe": ("30B-A3B", {"num_hidden_layers": 2}, 1024, 4, 100),
    "qlora": ("32B", {"vocab_size": 151936}, 4096, 1, 20),
    "fp8-lora": ("1.7B", {}, 2048, 2, 50),
    "compile": ("0.6B", {}, 1024, 4, 30),
    "tiled-mlp": ("0.6B", {}, 4096, 1, 30),
}
SMOKE = {
    "dense": ("tiny", {}, 64, 2, 6),
    "lora": ("tiny", {}, 64, 2, 6),
    "moe": ("tiny-moe", {}, 64, 2, 6),
    "qlora": ("tiny", {}, 64, 2, 4),
    "fp8-lora": ("tiny", {}, 64, 2, 4),
    "compile": ("tiny", {}, 64, 2, 4),
    "tiled-mlp": ("tiny", {}, 64, 2, 4),
}
TILE = {"gpu": 1024, "smoke": 16}  # tiled-mlp's tokens per tile
# parts whose point is a GPU kernel path: --smoke reports them skipped
GPU_ONLY = {
    "fp8-lora": "float8 needs a GPU of compute capability >= 8.9",
    "compile": "compiled on the GPU only (minutes on a CPU)",
}
# |loss difference| per step between the two sides: the mean over all steps and the largest. bf16 products in
# another order move a loss of 4-11 by a few hundredths; fp32 on the CPU agrees to rounding.
TOLERANCE = {"gpu": {"mean": 0.05, "max": 0.15}, "smoke": {"mean": 1e-3, "max": 1e-3}}
FP8_TOLERANCE = {
    "mean": 0.1,
    "max": 0.25,
}  # float8 products against bf16 (the bench's FP8_ABS_TOL doubled: LoRA's frozen base)
QLORA_PEAK_GIB = 40  # Qwen3-32B with an NF4 base at seq 4096 with checkpointing must start and train within this
LORA = {
    "r": 16,
    "alpha": 32,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
LR = {"dense": 3e-4, "lora": 1e-3, "moe": 3e-4, "qlora": 1e-3, "fp8-lora": 1e-3, "compile": 3e-4, "tiled-mlp": 3e-4}


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _config(part: str, smoke: bool, run_dir: str, side: str, model_path: str | None):
    from train.front.config import TrainConfig

    shape, dims, seq, batch, steps = (SMOKE if smoke else GPU)[part]
    model = {"path": model_path} if model_path else {"shape": shape, "dims": dims}
    lora = dict(LORA, enabled=True) if part in ("lora", "qlora", "fp8-lora") else {}
    if part == "qlora":
        lora["quantize_base"] = "nf4"
    # MoE: bf16 parameters and AdamW state on both sides (transformers' grouped_mm takes bf16 weights)
    precision = {"master_dtype": "bf16", "dtype": "bf16"} if part == "moe" and not smoke else {}
    return TrainConfig(
        model=model,
        seq_len=seq,
        micro_batch=batch,
        global_batch=batch,
        steps=steps,
        **precision,
        compile=side == "ours-compiled",
        activation_checkpointing=part in ("qlora", "tiled-mlp"),
        tiled_mlp=TILE["smoke" if smoke else "gpu"] if side == "ours-tiled" else 0,
        fp8={"enabled": side == "ours-fp8"},
        lora=lora,
        optim={"lr": LR[part]},
        schedule={"warmup_steps": min(10, steps // 4), "min_lr": LR[part] / 10},
        log={"dir": run_dir, "log_every": 1000},
        checkpoint={"dir": f"{run_dir}/checkpoints"},
    )


def _hf_dir(part: str, smoke: bool, out: Path) -> str:
    """A seeded transformers model of the part's shape saved as a Hugging Face directory: both sides start from it."""
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    from train.data.tokenizer import load_tokenizer
    from train.front.config import ModelConfig
    from train.model import hf_config

    shape, dims, *_ = (SMOKE if smoke else GPU)[part]
    tokenizer = load_tokenizer(None)
    config = hf_config(ModelConfig(shape=shape, dims=dims), tokenizer)
    torch.manual_seed(0)
    with torch.device(_device()):  # a seeded init on the GPU: seconds instead of minutes for the larger shapes
        model = (Qwen3MoeForCausalLM if part == "moe" else Qwen3ForCausalLM)(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def _imbalance(counts) -> list[float]:
    """Each MoE layer's max/mean tokens per expert, from (L, E) counts."""
    return (counts.max(dim=1).values / counts.float().mean(dim=1).clamp(min=1e-9)).tolist()


def _ours(cfg, part: str) -> dict:
    import torch

    from train.moe import routing_summary

    trainer, startup = one_rank_trainer(cfg, run_id="suite")
    device = trainer.device
    losses, load = [], []
    t0 = time.perf_counter()
    for _ in range(cfg.steps):
        record = trainer.train_step()
        losses.append(float(record["loss"]))
        if part == "moe":
            load.append(_imbalance(routing_summary(trainer.model)[1].float()))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"losses": losses, "load": load, "startup_s": startup, "seconds": seconds}


def _stream(cfg):
    from train.data import TokenStream, load_tokenizer, load_tokens
    from train.front.tokenizer import tokenizer_source

    tokenizer = load_tokenizer(tokenizer_source(cfg.data.tokenizer, cfg.model.path, cfg.data.format == "chat"))
    return TokenStream(
        load_tokens(cfg.data, tokenizer, cache_dir=f"{cfg.log.dir}/cache"),
        cfg.seq_len,
        cfg.global_batch,
        cfg.micro_batch,
        0,
        1,
        cfg.seed,
    )


def _peer(cfg, part: str, side: str) -> dict:
    """transformers (dense, MoE) or peft (LoRA) with the trainer's data, schedule, AdamW and clipping."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from train.adapters import PEFT_PREFIX
    from train.loop import lr_at

    device = _device()
    t0 = time.perf_counter()
    bf16 = cfg.master_dtype == "bf16"  # bf16 parameters as the trainer's, else fp32 under bf16 autocast
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.bfloat16 if bf16 else torch.float32).to(
        device
    )
    if part == "moe":
        model.config._experts_implementation = "grouped_mm" if device.type == "cuda" else "eager"
    if side == "peft":
        from peft import LoraConfig, get_peft_model
        from safetensors.torch import load_file

        model = get_peft_model(
            model,
            LoraConfig(
                r=LORA["r"],
                lora_alpha=LORA["alpha"],
                lora_dropout=LORA["dropout"],
                target_modules=LORA["target_modules"],
            ),
        )
        initial = load_file(Path(cfg.log.dir).parent / "initial_adapters.safetensors")
        state = {
            PEFT_PREFIX + k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): v
            for k, v in initial.items()
        }
        loaded = model.load_state_dict(state, strict=False)
        if loaded.unexpected_keys or len(state) != sum(1 for n, _ in model.named_parameters() if "lora_" in n):
            raise RuntimeError(f"peft's adapters are not the trainer's: {loaded.unexpected_keys[:3]}")
    model.train()
    stream = _stream(cfg)
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params,
        lr=o.lr,
        betas=o.betas,
        eps=o.eps,
        weight_decay=o.weight_decay,
        **({"fused": True} if device.type == "cuda" else {"foreach": False}),
    )
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and not bf16 else contextlib.nullcontext()
    )
    startup = time.perf_counter() - t0
    losses, load = [], []
    t0 = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        lr = lr_at(step, o.lr, cfg.schedule.warmup_steps, cfg.schedule.min_lr, cfg.steps)
        for group in opt.param_groups:
            group["lr"] = lr
        ((x, y),) = stream.next_microbatches()
        x, y = x.to(device), y.to(device)
        with autocast:
            out = model(input_ids=x, output_router_logits=True) if part == "moe" else model(input_ids=x)
            loss = F.cross_entropy(out.logits.float().flatten(0, 1), y.flatten())
        objective = loss
        if part == "moe":
            from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

            c = model.config
            objective = loss + c.router_aux_loss_coef * load_balancing_loss_func(
                out.router_logits, c.num_experts, c.num_experts_per_tok
            )
            counts = torch.stack(
                [
                    torch.bincount(r.topk(c.num_experts_per_tok, dim=-1).indices.flatten(), minlength=c.num_experts)
                    for r in out.router_logits
                ]
            )
            load.append(_imbalance(counts.float()))
        objective.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    return {"losses": losses, "load": load, "startup_s": startup, "seconds": seconds}


def _save_initial_adapters(cfg, path: Path) -> None:
    """The trainer's initial adapters (drawn as a run of this config draws them) for peft to start from."""
    import torch
    from safetensors.torch import save_file

    from train.adapters import LoraLinear, apply_lora, init_adapters
    from train.data.tokenizer import load_tokenizer
    from train.front.config import LoraConfig
    from train.front.tokenizer import tokenizer_source
    from train.model import build_meta_model, hf_config

    config = hf_config(cfg.model, load_tokenizer(tokenizer_source(cfg.data.tokenizer, cfg.model.path, False)))
    model = build_meta_model(config)
    apply_lora(model, LoraConfig(**LORA, enabled=True), torch.float32)
    for module in model.modules():
        if isinstance(module, LoraLinear):
            module.lora_A.to_empty(device="cpu")
            module.lora_B.to_empty(device="cpu")
    init_adapters(model, cfg.seed)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if ".lora_" in k}, path)


def _one(part: str, side: str, smoke: bool, model_path: str | None, work: str) -> dict:
    import torch

    device = _device()
    run_dir = tempfile.mkdtemp(dir=work)
    cfg = _config(part, smoke, run_dir, side, model_path)
    out = _ours(cfg, part) if side.startswith("ours") else _peer(cfg, part, side)
    from train.metrics import peak_memory_gib

    tokens = cfg.steps * cfg.global_batch * cfg.seq_len
    return out | {
        "part": part,
        "side": side,
        "peak_gib": peak_memory_gib(device),
        "tokens_per_s": tokens / out["seconds"],
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    }


def _compare(a: list[float], b: list[float]) -> dict:
    diffs = [abs(x - y) for x, y in zip(a, b, strict=False)]
    return {"mean_abs_diff": sum(diffs) / len(diffs), "max_abs_diff": max(diffs), "final": [a[-1], b[-1]]}


def _verdict(part: str, rows: dict, smoke: bool) -> dict:
    """Pass or fail of one part against its tolerance, with the figures."""
    if any("error" in r for r in rows.values()):
        return {"pass": False, "why": "; ".join(f"{s}: {r['error']}" for s, r in rows.items() if "error" in r)}
    losses = [r["losses"] for r in rows.values()]
    if any(not all(math.isfinite(x) for x in ls) for ls in losses):
        return {"pass": False, "why": "a loss is not finite"}
    if part == "qlora":
        (ours,) = losses
        peak = rows["ours"]["peak_gib"]
        ok = len(ours) == (SMOKE if smoke else GPU)[part][4] and (smoke or peak <= QLORA_PEAK_GIB)
        return {
            "pass": ok,
            "why": f"{len(ours)} steps, loss {ours[0]:.3f} -> {ours[-1]:.3f}, peak {peak:.1f} GiB"
            + ("" if smoke else f" (<= {QLORA_PEAK_GIB})"),
        }
    tol = FP8_TOLERANCE if part == "fp8-lora" and not smoke else TOLERANCE["smoke" if smoke else "gpu"]
    c = _compare(*losses)
    ok = c["mean_abs_diff"] <= tol["mean"] and c["max_abs_diff"] <= tol["max"]
    return c | {
        "pass": ok,
        "tolerance": tol,
        "why": (
            f"|loss diff| mean {c['mean_abs_diff']:.4f} (<= {tol['mean']}), max {c['max_abs_diff']:.4f} (<= "
            f"{tol['max']})"
        ),
    }


def _plots(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in results if any("losses" in r for r in results[p]["sides"].values())]
    files = []
    if shown:
        fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.4), squeeze=False)
        for ax, part in zip(axes[0], shown, strict=False):
            for side, r in results[part]["sides"].items():
                if "losses" in r:
                    ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=side, lw=1.2)
            ax.set_title(f"{part} ({results[part]['setup']})", fontsize=8)
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel("loss")
        fig.tight_layout()
        fig.savefig(out / "curves.png", dpi=110)
        files.append("curves.png")
    moe = results.get("moe", {}).get("sides", {})
    if any(r.get("load") for r in moe.values()):
        fig, ax = plt.subplots(figsize=(6.5, 3.4))
        for (side, r), style in zip(moe.items(), ("-", "--"), strict=False):
            for layer in range(len(r["load"][0])):
                ax.plot(
                    range(1, len(r["load"]) + 1),
                    [s[layer] for s in r["load"]],
                    style,
                    lw=1,
                    label=f"{side} layer {layer}",
                )
        ax.set_xlabel("step")
        ax.set_ylabel("max / mean tokens per expert")
        ax.set_title("MoE load per layer (1 = balanced)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "moe_load.png", dpi=110)
        files.append("moe_load.png")
    return files


def _report(results: dict, out: Path, files: list[str], device: str, smoke: bool) -> str:
    lines = [
        f"# GPU suite, {datetime.date.today()} ({device}{', smoke on the CPU' if smoke else ''})",
        "",
        "`python bench/gpu_suite.py" + (" --smoke" if smoke else "") + "`",
        "",
        "| part | setup | pass | figures | sides: tokens/s, peak GiB, start-up s |",
        "|---|---|---|---|---|",
    ]
    for part, r in results.items():
        v = r["verdict"]
        sides = "; ".join(
            f"{s}: {x['tokens_per_s']:,.0f}, {x['peak_gib']:.1f}, {x['startup_s']:.0f}"
            for s, x in r["sides"].items()
            if "tokens_per_s" in x
        )
        mark = {True: "pass", False: "FAIL", None: "skipped"}[v["pass"]]
        lines.append(f"| {part} | {r['setup']} | {mark} | {v['why']} | {sides} |")
    lines += [""] + [f"![{f}]({f})" for f in files]
    text = "\n".join(lines) + "\n"
    (out / "suite.md").write_text(text)
    return text


def _write_json(out: Path, results: dict, device: str, smoke: bool) -> None:
    (out / "suite.json").write_text(
        json.dumps(
            {
                "date": str(datetime.date.today()),
                "device": device,
                "smoke": smoke,
                "tolerance": TOLERANCE,
                "fp8_tolerance": FP8_TOLERANCE,
                "results": results,
            },
            indent=1,
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / f"gpu-suite-{datetime.date.today()}"))
    ap.add_argument("--smoke", action="store_true", help="the tiny shapes on the CPU")
    ap.add_argument("--one", nargs=3, metavar=("PART", "SIDE", "MODEL_PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        part, side, path = a.one
        print("RESULT " + json.dumps(_one(part, side, a.smoke, None if path == "-" else path, a.work)), flush=True)
        os._exit(0)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results, device = {}, "cpu"
    with tempfile.TemporaryDirectory() as work:
        for part in a.parts:
            shape, dims, seq, batch, steps = (SMOKE if a.smoke else GPU)[part]
            setup = f"{shape}{'' if not dims else ' ' + json.dumps(dims)}, {batch} x {seq}, {steps} steps"
            print(f"[suite] {part}: {setup}", flush=True)
            if a.smoke and part in GPU_ONLY:
                results[part] = {"setup": setup, "sides": {}, "verdict": {"pass": None, "why": GPU_ONLY[part]}}
                continue
            path = "-" if part == "qlora" else _hf_dir(part, a.smoke, Path(work) / part)
            if part in ("lora", "fp8-lora"):
                _save_initial_adapters(
                    _config(part, a.smoke, f"{work}/{part}-adapters", "ours", path),
                    Path(work) / "initial_adapters.safetensors",
                )
            rows = {}
            for side in SIDES[part]:
                t0 = time.perf_counter()
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                proc = subprocess.run(
                    [sys.executable, __file__, "--one", part, side, path, "--work", work]
                    + (["--smoke"] if a.smoke else []),
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    env=env,
                )
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()
                    rows[side] = {"error": tail[-1][:300] if tail else f"exit {proc.returncode}"}
                    print(f"[suite] {part}/{side} failed:\n{proc.stderr[-4000:]}", flush=True)
                    continue
                rows[side] = json.loads(line[len("RESULT ") :])
                device = rows[side]["device"]
                print(
                    f"[suite] {part}/{side}: {time.perf_counter() - t0:.0f} s, final loss "
                    f"{rows[side]['losses'][-1]:.4f}, "
                    f"{rows[side]['tokens_per_s']:,.0f} tok/s, peak {rows[side]['peak_gib']:.1f} GiB",
                    flush=True,
                )
            results[part] = {"setup": setup, "sides": rows, "verdict": _verdict(part, rows, a.smoke)}
            print(f"[suite] {part}: {results[part]['verdict']}", flush=True)
            _write_json(out, results, device, a.smoke)  # after every part: a run cut short keeps what it measured
    _write_json(out, results, device, a.smoke)
    files = _plots(results, out)
    print(_report(results, out, files, device, a.smoke))
    failed = [p for p, r in results.items() if r["verdict"]["pass"] is False]
    print(f"[suite] {'FAILED: ' + ', '.join(failed) if failed else 'all parts pass'}; report in {out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
