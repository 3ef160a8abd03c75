"""Qwen3-30B-A3B (fewer layers) on one GPU: the trainer's grouped experts against transformers' Qwen3MoeForCausalLM.

    python bench/moe_bench.py [--layers 8] [--batch 2] [--variants ours ours-compile hf-grouped] [--routing
    learned|balanced]
                              [--parity] [--out FILE]

Same shape (Qwen3-30B-A3B's dims with --layers decoder layers, all MoE), sequence 4096, batch, data, bf16 parameters
and AdamW state, fused AdamW, gradient clipping. Variants, each in its own process:
  ours          train.loop.Trainer on one rank: MoEBlock (torch._grouped_mm, fp32 combine), fused linear cross-entropy,
                plus the load-balancing loss (coefficient 0.001)
  ours-compile  the same with compile=true (each decoder layer compiled)
  hf-grouped    transformers' Qwen3MoeForCausalLM with experts_implementation "grouped_mm" (its fastest on Hopper),
                eager, SDPA, logits then cross-entropy; no load-balancing loss (output_router_logits off, its default)
Both sides run the trainer's learning-rate schedule (train.loop.lr_at) over the same steps. --routing balanced forces
both sides' routers to a round-robin assignment (token t to experts t*k .. t*k+k-1 mod E, weighted by the router's own
probabilities of those experts), as peers benchmark grouped experts: the products then run on equal groups, where a
random init sends most tokens of a layer to a few experts. Each side reports its worst layer's max/mean tokens per
expert.
Model TFLOP/s = tokens/s x FLOPs per token on active parameters (train.metrics.flops_per_token:
6 x (active non-embedding + lm_head) + 12 x layers x heads x head_dim x seq). Timed steps follow warm-up steps.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from one_gpu import one_rank_trainer, timed

ROOT = Path(__file__).resolve().parent.parent

SEQ, WARMUP, TIMED = 4096, 3, 10


def _config(layers: int, batch: int, run_dir: str, compile: bool):
    from train.front.config import TrainConfig

    return TrainConfig(
        model={"shape": "30B-A3B", "dims": {"num_hidden_layers": layers}},
        seq_len=SEQ,
        micro_batch=batch,
        global_batch=batch,
        steps=WARMUP + TIMED,
        compile=compile,
        master_dtype="bf16",
        dtype="bf16",
        log={"dir": run_dir, "log_every": 1000},
        schedule={"warmup_steps": 0},
        checkpoint={"dir": f"{run_dir}/checkpoints"},
    )


def _balanced(tokens: int, k: int, experts: int, device):
    """Round-robin top-k: token t to experts (t*k + j) mod E, j < k (equal groups when tokens x k divides by E)."""
    import torch

    return (torch.arange(tokens, device=device)[:, None] * k + torch.arange(k, device=device)[None, :]) % experts


def _force_balanced() -> None:
    """Both sides' routers choose _balanced's experts and weight them by their own probabilities."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3_moe import modeling_qwen3_moe as hf

    from train import moe

    def ours(self, x):
        probs = F.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
        experts = _balanced(x.shape[0], self.top_k, probs.shape[1], x.device)
        weights = probs.gather(1, experts)
        return probs, weights / weights.sum(-1, keepdim=True) if self.norm_topk_prob else weights, experts

    def theirs(self, hidden_states):
        logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
        probs = F.softmax(logits, dtype=torch.float, dim=-1)
        experts = _balanced(logits.shape[0], self.top_k, self.num_experts, logits.device)
        weights = probs.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(logits.dtype), experts

    moe.Router.forward = ours
    hf.Qwen3MoeTopKRouter.forward = theirs


def _ours(cfg) -> dict:
    trainer, _ = one_rank_trainer(cfg)
    records = []
    seconds, warm = timed(lambda: records.append(trainer.train_step()), WARMUP, TIMED)
    return {
        "seconds": seconds,
        "warmup_s": warm,
        "flops_per_token": trainer.flops_per_token,
        "loss": float(records[-1]["loss"]),
        "moe_load_imbalance": float(records[-1]["moe_load_imbalance"]),
    }


def _hf(cfg) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3MoeForCausalLM

    from train.data import TokenStream, load_tokenizer, load_tokens
    from train.metrics import flops_per_token
    from train.model import count_params, hf_config

    device = torch.device("cuda")
    tokenizer = load_tokenizer(None)
    config = hf_config(cfg.model, tokenizer)
    config._experts_implementation = "grouped_mm"
    stream = TokenStream(
        load_tokens(cfg.data, tokenizer, cache_dir=f"{cfg.log.dir}/cache"),
        cfg.seq_len,
        cfg.global_batch,
        cfg.micro_batch,
        0,
        1,
        cfg.seed,
    )
    torch.manual_seed(cfg.seed)
    with torch.device(device):
        model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.train()
    o = cfg.optim
    opt = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, fused=True
    )
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    from train.loop import lr_at

    last, done, chosen = {}, [0], []
    for module in model.modules():  # the experts each router chose (forced ones too), as the layers used them
        if isinstance(module, Qwen3MoeTopKRouter):
            module.register_forward_hook(lambda _m, _args, out: chosen.append(out[2].detach()))

    def step():
        done[0] += 1
        for group in opt.param_groups:
            group["lr"] = lr_at(done[0], o.lr, cfg.schedule.warmup_steps, cfg.schedule.min_lr, cfg.steps)
        ((x, y),) = stream.next_microbatches()
        chosen.clear()
        logits = model(input_ids=x.to(device)).logits
        counts = torch.stack([torch.bincount(e.flatten(), minlength=config.num_experts) for e in chosen]).float()
        last["imbalance"] = (counts.max(dim=1).values / counts.mean(dim=1)).max()
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last["loss"] = loss.detach()

    seconds, warm = timed(step, WARMUP, TIMED)
    fpt = flops_per_token(
        count_params(config), config.num_hidden_layers, config.num_attention_heads, config.head_dim, cfg.seq_len
    )
    return {
        "seconds": seconds,
        "warmup_s": warm,
        "flops_per_token": fpt,
        "loss": float(last["loss"]),
        "moe_load_imbalance": float(last["imbalance"]),
        "experts_implementation": config._experts_implementation,
    }


def _parity() -> dict:
    """On the GPU, 2 layers of 30B-A3B's dims, one batch of 2 x 512 tokens: how far the bf16 logits of ours (grouped
    products, fp32 combine) and of transformers (grouped_mm experts) are from transformers' fp32 eager logits."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    from train.data.tokenizer import load_tokenizer
    from train.front.config import ModelConfig
    from train.model import hf_config
    from train.moe import Qwen3MoeForTraining

    config = hf_config(ModelConfig(shape="30B-A3B", dims={"num_hidden_layers": 2}), load_tokenizer(None))
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = Qwen3MoeForCausalLM(config).float()
    ids = torch.randint(0, 2000, (2, 512), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    out = {}
    with torch.no_grad():
        expected = ref(input_ids=ids).logits
        state = ref.state_dict()
        config._experts_implementation = "grouped_mm"
        with torch.device("cuda"):
            hf = Qwen3MoeForCausalLM(config)
            ours = Qwen3MoeForTraining(config)
        for name, model in (("hf-grouped", hf), ("ours", ours)):
            model.load_state_dict(state)
            got = model.to(torch.bfloat16)(input_ids=ids).logits.float()
            out[name] = {
                "max_abs_diff": (got - expected).abs().max().item(),
                "mean_abs_diff": (got - expected).abs().mean().item(),
            }
    return out


def _one(variant: str, layers: int, batch: int, routing: str) -> dict:
    import torch

    if routing == "balanced":
        _force_balanced()
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = _config(layers, batch, run_dir, compile=variant == "ours-compile")
        out = _hf(cfg) if variant == "hf-grouped" else _ours(cfg)
    tokens_per_s = TIMED * batch * SEQ / out["seconds"]
    return out | {
        "variant": variant,
        "routing": routing,
        "layers": layers,
        "batch": batch,
        "seq": SEQ,
        "tokens_per_s": tokens_per_s,
        "model_tflops": tokens_per_s * out["flops_per_token"] / 1e12,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "gpu": torch.cuda.get_device_name(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["ours", "ours-compile", "hf-grouped"])
    ap.add_argument("--routing", choices=["learned", "balanced"], default="learned")
    ap.add_argument(
        "--parity",
        action="store_true",
        help="first, the bf16 logits' distance from fp32 (ours and transformers'), in a process of its own",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.one == "parity":
        print("RESULT " + json.dumps(_parity()), flush=True)
        return
    if a.one:
        print("RESULT " + json.dumps(_one(a.one, a.layers, a.batch, a.routing)), flush=True)
        return
    rows = []
    parity = None
    for variant in (["parity"] if a.parity else []) + a.variants:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                variant,
                "--layers",
                str(a.layers),
                "--batch",
                str(a.batch),
                "--routing",
                a.routing,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            rows.append(
                {
                    "variant": variant,
                    "error": (proc.stderr or proc.stdout).strip().splitlines()[-1][:300]
                    if (proc.stderr or proc.stdout)
                    else f"exit {proc.returncode}",
                }
            )
            print(f"{variant}: failed: {rows[-1]['error']}\n{proc.stderr[-3000:]}", flush=True)
            continue
        if variant == "parity":
            parity = json.loads(line[len("RESULT ") :])
            print(
                f"bf16 logits vs transformers' fp32 eager (2 layers, 2 x 512 tokens): {json.dumps(parity)}", flush=True
            )
            continue
        rows.append(json.loads(line[len("RESULT ") :]))
        print(
            f"{variant}: {rows[-1]['tokens_per_s']:,.0f} tok/s, imbalance {rows[-1]['moe_load_imbalance']:.2f}",
            flush=True,
        )
    base = next((r for r in rows if r["variant"] == "hf-grouped" and "error" not in r), None)
    print(
        f"Qwen3-30B-A3B dims, {a.layers} layers, seq {SEQ} x batch {a.batch}, bf16, {a.routing} routing, one GPU "
        f"({next((r['gpu'] for r in rows if 'gpu' in r), '?')})"
    )
    print(f"{'variant':<14} {'tok/s':>9} {'TFLOP/s':>8} {'vs hf':>6} {'peak GiB':>9} {'loss':>7} {'imbalance':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<14} failed: {r['error']}")
            continue
        speed = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        print(
            f"{r['variant']:<14} {r['tokens_per_s']:>9,.0f} {r['model_tflops']:>8.1f} {speed:>6} "
            f"{r['peak_mem_gib']:>9.1f} {r['loss']:>7.3f} "
            f"{r['moe_load_imbalance']:>9.2f}"
        )
    out = Path(
        a.out or ROOT / "bench" / "results" / f"{datetime.date.today()}-moe-30B-A3B-{a.layers}l-{a.routing}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"layers": a.layers, "batch": a.batch, "seq": SEQ, "routing": a.routing, "rows": rows, "parity": parity},
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
