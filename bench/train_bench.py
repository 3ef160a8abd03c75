"""The project's trainer against its peers on one GPU: same shape, sequence length and batch.

    python bench/train_bench.py [--shapes 1.7B 4B 0.6B 8B] [--variants ours liger baseline] [--parity-shape 1.7B]
                                [--parity-steps 50] [--checkpoint-shape 1.7B] [--timed-steps 10] [--lr-warmup 0]
                                [--batch SHAPE=N ...] [--set KEY=VALUE ...] [--cases SHAPE:VARIANT ...] [--out FILE]

Variants (each (shape, variant) runs in its own process):
  ours      train.loop.Trainer on one rank (dp=1 x tp=1, no FSDP): fp32 master weights (8B: bf16), bf16 compute
            (bf16 model, fp32 twin: train/precision.py), per-block torch.compile, fused linear cross-entropy, fused
            AdamW
  ours-fp8, ours-fp8-rowwise  the same with fp8.enabled (torchao float8 decoder linears, tensorwise or rowwise recipe;
            4B: bf16 master weights)
  liger     transformers' Qwen3ForCausalLM with Liger kernels (apply_liger_kernel_to_qwen3: RoPE, RMSNorm, SwiGLU,
            fused linear cross-entropy), eager, bf16 parameters and AdamW state, fused AdamW (needs liger-kernel)
  liger-fp8 the liger model with torchao float8 (tensorwise) on the decoder layers' linears and each layer compiled
  baseline  transformers' Qwen3ForCausalLM in bf16 (parameters and AdamW state), SDPA attention,
            fused AdamW, the whole model plus the cross-entropy under one torch.compile
            (8B: eager with transformers' gradient checkpointing, as it does not fit otherwise)
  reference transformers' model with fp32 parameters under bf16 autocast, eager (for loss parity only)
  baseline-split  the baseline with each step's samples in twice the micro-batches, half as large: the same
            arithmetic in another order, so its distance from the baseline is how far rounding alone moves
            the baseline's losses (for loss parity only)

All run the trainer's data stream, learning-rate schedule and gradient clipping from the same
seed; in the parity shape the peers also start from the trainer's initial weights, and all
steps' losses are kept. MFU = tokens/s x FLOPs per token / 989e12 (dense bf16 peak of an H100/H200, train/metrics.py),
FLOPs per token = 6 x (non-embedding params + lm_head params) + 12 x layers x heads x head_dim x seq;
for float8 variants the same formula (bf16-equivalent MFU). Timing excludes the warm-up steps
(compilation) and is taken between device synchronizations. The table compares each variant with
the fastest bf16 peer and the fastest float8 peer of the same shape in the run.
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
from typing import NamedTuple, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hpc.node.cli import Parser, number, whole
from train.metrics import PEAK_FLOPS_BF16

ROOT = Path(__file__).resolve().parent.parent

SEQ = 4096
PEAK = PEAK_FLOPS_BF16["H200"]  # the GPU of these runs


class Case(NamedTuple):
    """Per shape: the micro-batch (samples of SEQ tokens), micro-batches per optimizer step, ours' parameter/AdamW
    dtype, how the baseline runs; ours' parameter/AdamW dtype in its float8 variants where it differs."""

    batch: int
    accum: int = 1
    master_dtype: str = "fp32"
    baseline_compiled: bool = True
    baseline_ac: bool = False
    fp8_master_dtype: str | None = None


# The largest micro-batch each side fits in 139 GiB. The 4B steps over three micro-batches of 3
# (9 x 4096 tokens, both sides), so the optimizer's pass over 16 bytes of fp32 state per parameter
# is paid once per 9 samples (with 4 x 4096 micro-batches ours has no room left for the fp32
# gradients they add up in); ours in float8 keeps bf16 state, as Liger does (its float8 casts make
# the fp32 master's passes a larger share of the step). The 8B at 4 x 4096: ours with
# bf16 parameters and AdamW state (as the peers have; fp32 leaves no room for activations), the
# baseline eager with transformers' gradient checkpointing (compiled or without checkpointing it
# does not fit); 4 samples instead of 2 halve the share of the per-step costs (the optimizer's pass,
# float8 weight casts).
CASES = {
    "0.6B": Case(4),
    "1.7B": Case(12),
    "4B": Case(3, accum=3, fp8_master_dtype="bf16"),
    "8B": Case(4, master_dtype="bf16", baseline_compiled=False, baseline_ac=True),
}
WARMUP = 4
# The parity check's bar: per-step |loss difference| over the first steps, bf16 rounding noise.
PARITY_ABS_TOL = 0.05
# float8 against bf16 (ours-fp8 vs ours): the mean |loss difference| over the second half of the steps and the
# final step's |loss difference| must both stay under this (about 1% of a loss of 4 to 6).
FP8_ABS_TOL = 0.05
# Variants that are peers (not the project's trainer) and run for timing; by precision.
PEERS = {"baseline": "bf16", "liger": "bf16", "liger-fp8": "fp8"}
VARIANTS = [
    "ours",
    "ours-cudnn",
    "ours-fp8",
    "ours-fp8-rowwise",
    "liger",
    "liger-fp8",
    "baseline",
    "reference",
    "baseline-split",
]


def _precision(variant: str) -> str:
    return "fp8" if "fp8" in variant else "bf16"


def _config(
    shape: str,
    batch: int,
    accum: int,
    steps: int,
    run_dir: Path,
    ac: bool,
    master_dtype: str,
    sdpa: str,
    lr_warmup: int,
    fp8_recipe: str | None,
):
    from train.front.config import TrainConfig

    return TrainConfig(
        model={"shape": shape},
        seq_len=SEQ,
        micro_batch=batch,
        global_batch=batch * accum,
        steps=steps,
        compile=True,
        activation_checkpointing=ac,
        master_dtype=master_dtype,
        sdpa_backend=sdpa,
        log={"dir": str(run_dir)},
        fp8={"enabled": fp8_recipe is not None, "recipe": fp8_recipe or "tensorwise"},
        schedule={"warmup_steps": min(lr_warmup, steps)},
        checkpoint={"dir": str(run_dir / "checkpoints"), "keep_last": 1, "async_save": True},
    )


def _timed(step, warmup: int, timed: int) -> tuple[list, float, list[float], float]:
    """Run warmup + timed steps of ``step()``; returns every step's loss (device tensors), the timed steps' seconds,
    each timed step's seconds (CUDA events between steps: nothing waits for the device in between) and the warm-up's
    seconds."""
    import torch

    t_warm = time.perf_counter()
    losses = [step() for _ in range(warmup)]
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t_warm
    events = [torch.cuda.Event(enable_timing=True) for _ in range(timed + 1)]
    t0 = time.perf_counter()
    events[0].record()
    for e in events[1:]:
        losses.append(step())
        e.record()
    torch.cuda.synchronize()
    return (
        losses,
        time.perf_counter() - t0,
        [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:], strict=False)],
        warmup_s,
    )


def _ours(cfg, warmup: int, timed: int, save_checkpoint: bool) -> dict:
    from train.loop import Trainer
    from train.parallel import ParallelDims, WorldEnv, init_distributed

    env = WorldEnv(rank=0, local_rank=0, world_size=1, local_world_size=1)
    device = init_distributed(env)
    dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads())
    trainer = Trainer(cfg, dims, env, device, run_id="bench")
    losses, seconds, step_s, warmup_s = _timed(lambda: trainer.train_step()["loss"], warmup, timed)
    out = {
        "losses": [float(x) for x in losses],
        "seconds": seconds,
        "step_seconds": step_s,
        "warmup_s": warmup_s,
        "flops_per_token": trainer.flops_per_token,
    }
    if save_checkpoint:
        out["checkpoint"] = _checkpoint_times(trainer, seconds / timed)
    return out


def _checkpoint_times(trainer, step_s: float) -> dict:
    """A synchronous save and a load; then two background saves (the first allocates the pinned host buffers),
    training on while each is written: how long the step loop is blocked and what a step costs meanwhile."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    path = trainer.save()
    t1 = time.perf_counter()
    trainer.load(path)
    torch.cuda.synchronize()
    out = {
        "save_s": t1 - t0,
        "load_s": time.perf_counter() - t1,
        "bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file()),
        "step_s": step_s,
        "background": [],
    }
    for _ in range(2):
        t0 = time.perf_counter()
        trainer.save(background=True)
        blocked, steps = time.perf_counter() - t0, 0
        while not trainer.pending.future.done():
            trainer.train_step()
            torch.cuda.synchronize()
            steps += 1
        written = time.perf_counter() - t0
        trainer.finish_save()
        out["background"].append(
            {
                "blocked_s": blocked,
                "written_after_s": written,
                "steps_meanwhile": steps,
                "step_s_meanwhile": (written - blocked) / steps if steps else None,
            }
        )
    return out


def _hf(cfg, variant: str, warmup: int, timed: int, same_init: bool, compiled: bool) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3ForCausalLM

    from train.data import TokenStream, load_tokenizer, load_tokens
    from train.loop import lr_at
    from train.metrics import flops_per_token
    from train.model import count_params, hf_config, initial_value

    liger = variant.startswith("liger")
    if liger:  # patches transformers' Qwen3 classes before the model is built
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3

        apply_liger_kernel_to_qwen3(
            rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True, cross_entropy=False
        )
    device = torch.device("cuda")
    tokenizer = load_tokenizer(None)
    config = hf_config(cfg.model, tokenizer)
    stream = TokenStream(
        load_tokens(cfg.data, tokenizer, cache_dir=str(Path(cfg.log.dir) / "cache")),
        cfg.seq_len,
        cfg.global_batch,
        cfg.micro_batch,
        0,
        1,
        cfg.seed,
    )
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    if same_init:
        with torch.no_grad():  # the trainer's seeded init, tensor by tensor (a tied lm_head is the embedding)
            for name, value in model.state_dict().items():
                if not (config.tie_word_embeddings and name == "lm_head.weight"):
                    value.copy_(initial_value(name, tuple(value.shape), config.initializer_range, cfg.seed, device))
    autocast = variant == "reference"
    if not autocast:
        model.to(torch.bfloat16)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable()
    if variant == "liger-fp8":
        from train.float8 import convert_decoder_linears

        convert_decoder_linears(model.model.layers, "tensorwise", float8_all_gather=False)
        for layer in model.model.layers:
            layer.compile()
    model.train()
    o = cfg.optim
    opt = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, fused=True
    )

    def loss_fn(x, y):
        if liger:  # y is already shifted: Liger's fused linear cross-entropy takes it as shift_labels
            return model(input_ids=x, shift_labels=y).loss
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    fn = torch.compile(loss_fn) if compiled else loss_fn
    done = [0]

    def step():
        done[0] += 1
        for group in opt.param_groups:
            group["lr"] = lr_at(done[0], o.lr, cfg.schedule.warmup_steps, cfg.schedule.min_lr, cfg.steps)
        total = torch.zeros((), device=device)
        grad_accum = cfg.global_batch // cfg.micro_batch
        for x, y in stream.next_microbatches():
            loss = fn(x.to(device), y.to(device)) / grad_accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    losses, seconds, step_s, warmup_s = _timed(step, warmup, timed)
    fpt = flops_per_token(
        count_params(config), config.num_hidden_layers, config.num_attention_heads, config.head_dim, cfg.seq_len
    )
    return {
        "losses": [float(x) for x in losses],
        "seconds": seconds,
        "step_seconds": step_s,
        "warmup_s": warmup_s,
        "flops_per_token": fpt,
    }


def _batches(items: list[str]) -> dict[str, int]:
    """--batch SHAPE=N items as {shape: batch}; ValueError names the first bad one."""
    out = {}
    for item in items:
        name, _, n = item.partition("=")
        if name not in CASES or not n.isdigit() or int(n) < 1:
            raise ValueError(
                f"--batch {item!r}: must be SHAPE=N with SHAPE one of {', '.join(CASES)} and N a positive integer"
            )
        out[name] = int(n)
    return out


def _cases(items: list[str]) -> list[tuple[str, str]]:
    """--cases SHAPE:VARIANT items as pairs; ValueError names the first bad one."""
    out = []
    for item in items:
        shape, _, variant = item.partition(":")
        if shape not in CASES or variant not in VARIANTS:
            raise ValueError(
                f"--cases {item!r}: must be SHAPE:VARIANT with SHAPE one of {', '.join(CASES)} and VARIANT one of "
                f"{', '.join(VARIANTS)}"
            )
        out.append((shape, variant))
    return out


def _check_overrides(items: list[str]) -> None:
    """--set items applied to a trainer config of the first shape; ValueError (ConfigError, pydantic's) names the bad
    one."""
    from pydantic import ValidationError

    from train.front.config import ConfigError, TrainConfig, apply_overrides

    raw = {"model": {"shape": next(iter(CASES))}, "seq_len": SEQ, "micro_batch": 1, "global_batch": 1, "steps": 1}
    try:
        TrainConfig.model_validate(apply_overrides(raw, items))
    except ConfigError as e:
        raise ValueError(f"--set: {e}") from None
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"--set {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def worker(args) -> None:
    """One (shape, variant) in this process; writes its result as JSON to args.result."""
    import torch

    shape, variant = args.worker
    case = CASES[shape]._replace(batch=_batches(args.batch).get(shape, CASES[shape].batch))
    if variant == "baseline-split":
        if case.batch % 2:
            raise SystemExit(
                f"baseline-split: the {shape} micro-batch ({case.batch}) must be even (set one with --batch {shape}=N)"
            )
        case = case._replace(batch=case.batch // 2, accum=case.accum * 2)
    ours = variant.startswith("ours")
    fp8_ours = ours and _precision(variant) == "fp8"
    if fp8_ours and case.fp8_master_dtype:
        case = case._replace(master_dtype=case.fp8_master_dtype)
    parity = shape == args.parity_shape
    steps = args.parity_steps if parity else WARMUP + args.timed_steps
    warmup = WARMUP if not parity else min(10, steps // 2)
    ac = case.baseline_ac and variant.startswith("baseline")
    compiled = ours or (case.baseline_compiled and variant.startswith("baseline"))
    sdpa = "cudnn" if variant == "ours-cudnn" else "auto"
    fp8_recipe = ("rowwise" if variant.endswith("rowwise") else "tensorwise") if fp8_ours else None
    cfg = _config(
        shape,
        case.batch,
        case.accum,
        steps,
        Path(args.run_dir) / f"{shape}-{variant}",
        ac,
        case.master_dtype if ours else "fp32",
        sdpa,
        args.lr_warmup,
        fp8_recipe,
    )
    if ours and args.set:
        from train.front.config import TrainConfig, apply_overrides

        cfg = TrainConfig.model_validate(apply_overrides(cfg.model_dump(mode="json"), args.set))
    torch.manual_seed(cfg.seed)
    if ours:
        out = _ours(cfg, warmup, steps - warmup, save_checkpoint=shape == args.checkpoint_shape and variant == "ours")
    else:
        out = _hf(cfg, variant, warmup, steps - warmup, same_init=parity, compiled=compiled)
    tokens = (steps - warmup) * case.batch * case.accum * SEQ
    tps = tokens / out.pop("seconds")
    batch = f"{case.batch} x {SEQ}" if case.accum == 1 else f"{case.accum} x {case.batch} x {SEQ}"
    step_s = sorted(out["step_seconds"])
    out.update(
        shape=shape,
        variant=variant,
        batch=batch,
        precision=_precision(variant),
        activation_checkpointing=ac,
        step_s_min=step_s[0],
        step_s_median=step_s[len(step_s) // 2],
        step_s_max=step_s[-1],
        master_dtype=cfg.master_dtype if ours else "fp32" if variant == "reference" else "bf16",
        compiled="per layer" if variant == "liger-fp8" else compiled,
        overrides=args.set if ours else [],
        warmup_steps=warmup,
        timed_steps=steps - warmup,
        tokens_per_s=tps,
        mfu=tps * out["flops_per_token"] / PEAK,
        peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
    )
    Path(args.result).write_text(json.dumps(out))


def _run_case(shape: str, variant: str, args, run_dir: Path) -> dict:
    result = run_dir / f"{shape}-{variant}.json"
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        shape,
        variant,
        "--result",
        str(result),
        "--run-dir",
        str(run_dir),
        "--parity-shape",
        args.parity_shape,
        "--parity-steps",
        str(args.parity_steps),
        "--checkpoint-shape",
        args.checkpoint_shape,
        "--timed-steps",
        str(args.timed_steps),
        "--lr-warmup",
        str(args.lr_warmup),
        "--batch",
        *args.batch,
        "--set",
        *args.set,
    ]
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.case_timeout)
        ok = proc.returncode == 0 and result.exists()
        error = None if ok else (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        ok, error = False, f"timed out after {args.case_timeout} s"
    record = json.loads(result.read_text()) if ok else {"shape": shape, "variant": variant, "error": error}
    record["wall_s"] = time.perf_counter() - t0
    if ok:
        spread = (
            f"steps {record['step_s_min']:.3f}/{record['step_s_median']:.3f}/{record['step_s_max']:.3f} s "
            "(min/median/max)"
        )
    print(
        f"[bench] {shape} {variant}: "
        + (
            f"{record['tokens_per_s']:,.0f} tok/s, MFU {100 * record['mfu']:.1f}%, "
            f"{record['peak_mem_gib']:.1f} GiB, {spread}, warm-up {record['warmup_s']:.0f} s"
            if ok
            else f"FAILED\n{error}"
        )
        + f" ({record['wall_s']:.0f} s)",
        flush=True,
    )
    if "checkpoint" in record:
        c = record["checkpoint"]
        print(
            f"[bench] {shape} checkpoint {c['bytes'] / 1e9:.1f} GB: save {c['save_s']:.1f} s, load {c['load_s']:.1f} "
            "s; in the background: "
            + "; ".join(
                f"step loop blocked {b['blocked_s']:.1f} s, written after {b['written_after_s']:.1f} s, "
                f"{b['steps_meanwhile']} steps"
                for b in c["background"]
            )
            + f" (step {c['step_s']:.2f} s alone)",
            flush=True,
        )
    return record


def _diff_stats(a: list[float], b: list[float]) -> dict:
    """|a - b| per step: the maximum (and its step), the mean, and the maximum over steps 1-10, 11-20 and 21 on."""
    diffs = [abs(x - y) for x, y in zip(a, b, strict=False)]
    return {
        "max_abs_diff": max(diffs),
        "argmax_step": diffs.index(max(diffs)) + 1,
        "mean_abs_diff": sum(diffs) / len(diffs),
        "max_abs_diff_steps": {
            "1-10": max(diffs[:10]),
            "11-20": max(diffs[10:20], default=None),
            "21-": max(diffs[20:], default=None),
        },
    }


def parity(results: list[dict], shape: str) -> dict | None:
    """Per-step |loss difference| on the parity shape: ours against each other variant (baseline, reference, peers,
    float8), and the baseline's own rounding noise (baseline-split against baseline). The bf16 tolerance is that
    noise's maximum, or PARITY_ABS_TOL if larger; float8 against bf16 (ours-fp8 vs ours) is held to FP8_ABS_TOL."""
    by = {r["variant"]: r["losses"] for r in results if r["shape"] == shape and "losses" in r}
    if "ours" not in by:
        return None
    out = {"shape": shape, "steps": len(by["ours"]), "abs_tol": PARITY_ABS_TOL}
    if "baseline" in by and "baseline-split" in by:
        out["noise"] = _diff_stats(by["baseline-split"], by["baseline"])
        out["abs_tol"] = max(PARITY_ABS_TOL, out["noise"]["max_abs_diff"])
    for other in ("baseline", "reference"):
        if other in by:
            out[other] = _diff_stats(by["ours"], by[other])
            out[other]["within_tol"] = out[other]["max_abs_diff"] <= out["abs_tol"]
    for other in by.keys() - {"ours", "baseline", "reference", "baseline-split"}:
        out[other] = _diff_stats(by["ours"], by[other])
    if "ours-fp8" in by:
        diffs = [abs(a - b) for a, b in zip(by["ours-fp8"], by["ours"], strict=False)]
        late = diffs[len(diffs) // 2 :]
        fp8 = out["ours-fp8"]
        fp8.update(
            fp8_abs_tol=FP8_ABS_TOL,
            mean_abs_diff_second_half=sum(late) / len(late),
            final_abs_diff=diffs[-1],
            final_loss={"ours": by["ours"][-1], "ours-fp8": by["ours-fp8"][-1]},
        )
        fp8["within_tol"] = fp8["mean_abs_diff_second_half"] <= FP8_ABS_TOL and fp8["final_abs_diff"] <= FP8_ABS_TOL
    return out


def strongest_peers(results: list[dict]) -> dict[tuple[str, str], dict]:
    """The fastest peer run per (shape, precision)."""
    best: dict[tuple[str, str], dict] = {}
    for r in results:
        if r["variant"] in PEERS and "tokens_per_s" in r:
            key = (r["shape"], PEERS[r["variant"]])
            if key not in best or r["tokens_per_s"] > best[key]["tokens_per_s"]:
                best[key] = r
    return best


def table(results: list[dict]) -> str:
    """Markdown: one row per (shape, variant), its ratio to the fastest bf16 and the fastest float8 peer of the same
    shape."""
    best = strongest_peers(results)
    rows = [
        "| model | batch | variant | tokens/s | MFU | peak GiB | step s min/median/max | vs best bf16 peer | vs best "
        "fp8 peer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "mfu" not in r:
            rows.append(f"| Qwen3-{r['shape']} | | {r['variant']} | failed | | | | | |")
            continue
        ratios = [
            f"{r['tokens_per_s'] / best[(r['shape'], p)]['tokens_per_s']:.3f}x ({best[(r['shape'], p)]['variant']})"
            if (r["shape"], p) in best
            else ""
            for p in ("bf16", "fp8")
        ]
        rows.append(
            f"| Qwen3-{r['shape']} | {r['batch']} | {r['variant']} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% "
            f"| {r['peak_mem_gib']:.1f} | {r['step_s_min']:.3f}/{r['step_s_median']:.3f}/{r['step_s_max']:.3f} | "
            f"{ratios[0]} | {ratios[1]} |"
        )
    return "\n".join(rows)


def plot(results: list[dict], shape: str, path: Path) -> None:
    """Loss curves of the parity shape, and ours minus each other variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {r["variant"]: r["losses"] for r in results if r["shape"] == shape and "losses" in r}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for variant, losses in runs.items():
        top.plot(range(1, len(losses) + 1), losses, label=variant, linestyle="--" if variant == "ours" else "-")
        if variant not in ("ours", "baseline-split") and "ours" in runs:
            bottom.plot(
                range(1, len(losses) + 1),
                [a - b for a, b in zip(runs["ours"], losses, strict=False)],
                label=f"ours - {variant}",
            )
    if "baseline" in runs and "baseline-split" in runs:
        noise = [a - b for a, b in zip(runs["baseline-split"], runs["baseline"], strict=False)]
        bottom.plot(
            range(1, len(noise) + 1), noise, color="0.5", linestyle=":", label="baseline-split - baseline (reordering)"
        )
    lim = max([0.3] + [1.1 * abs(y) for line in bottom.get_lines() for y in line.get_ydata()])
    top.set(ylabel="loss", title=f"Qwen3-{shape}, seq {SEQ}: same initial weights and data")
    bottom.axhspan(-PARITY_ABS_TOL, PARITY_ABS_TOL, color="0.9", label=f"+-{PARITY_ABS_TOL}")
    bottom.set(xlabel="step", ylabel="loss difference", ylim=(-lim, lim))
    top.legend()
    bottom.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["1.7B", "4B", "0.6B", "8B"], choices=list(CASES))
    p.add_argument("--variants", nargs="+", default=["ours", "liger", "baseline"], choices=VARIANTS)
    p.add_argument(
        "--cases",
        nargs="+",
        default=None,
        metavar="SHAPE:VARIANT",
        help="run exactly these (shape, variant) pairs, in this order, instead of every shape x variant",
    )
    p.add_argument(
        "--parity-shape",
        default="1.7B",
        help="shape whose runs keep every step's loss for the loss comparison ('none': no comparison)",
    )
    p.add_argument("--parity-steps", type=whole(1), default=50)
    p.add_argument(
        "--checkpoint-shape",
        default="1.7B",
        help="also time the trainer's checkpoint save and load for this shape ('none': no timing)",
    )
    p.add_argument(
        "--timed-steps",
        type=whole(1),
        default=10,
        help="steps timed after the warm-up ones (a longer window evens out run-to-run spread)",
    )
    p.add_argument(
        "--batch",
        nargs="*",
        default=[],
        metavar="SHAPE=N",
        help="another batch (samples of 4096 tokens) for a shape, e.g. 1.7B=8",
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="trainer config overrides for the ours variants, e.g. compile_mode=max-autotune-no-cudagraphs",
    )
    p.add_argument(
        "--lr-warmup",
        type=whole(0),
        default=0,
        help="learning-rate warm-up steps of every run (changes no step's cost)",
    )
    p.add_argument("--case-timeout", type=number(0, 1e9, lo_open=True), default=420)
    p.add_argument("--out", type=Path, default=None, help="JSON file (default bench/results/<date>-h200.json)")
    p.add_argument("--commit", default=None, help="the commit measured (default: git rev-parse HEAD)")
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        _batches(args.batch)
        _check_overrides(args.set)
        pairs = (
            _cases(args.cases)
            if args.cases
            else [
                (shape, variant)
                for shape in args.shapes
                for variant in args.variants
                if variant not in ("reference", "baseline-split") or shape == args.parity_shape
            ]
        )
    except ValueError as e:
        p.error(str(e))
    if args.worker:
        return worker(args)

    import torch
    import transformers

    git = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    commit = args.commit or (git.stdout.strip() if git.returncode == 0 else "unknown (no git checkout: pass --commit)")
    out = args.out or ROOT / "bench" / "results" / f"{datetime.date.today()}-h200.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "commit": commit,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "seq_len": SEQ,
        "peak_flops": PEAK,
        "lr_warmup_steps": args.lr_warmup,
        "mfu_formula": (
            "tokens/s x (6 x (non-embedding params + lm_head params) + 12 x layers x heads x head_dim x "
            "seq) / peak_flops"
        ),
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for shape, variant in pairs:
            report["results"].append(_run_case(shape, variant, args, Path(tmp)))
            report["parity"] = parity(report["results"], args.parity_shape)
            out.write_text(json.dumps(report, indent=1))
    if report.get("parity"):
        plot(report["results"], args.parity_shape, out.with_suffix(".png"))
    print(table(report["results"]))
    print(json.dumps(report.get("parity")))


if __name__ == "__main__":
    main()
