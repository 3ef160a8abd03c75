"""A packed chat step against the text step and against padding every conversation to the longest, on one GPU.

    python bench/packed_bench.py [--shape 1.7B] [--seq 4096] [--rows 8] [--timed-steps 8] [--out FILE]

One Qwen3 (bf16 parameters, fused AdamW, the trainer's fused linear cross-entropy summed over the loss tokens,
activation checkpointing in every layer so that padded micro-batches fit), the same weights for every variant; each
step is ``--rows`` micro-batches of one row of ``--seq`` tokens:
  text            rows cut from one token stream (no position ids, every token a target): causal SDPA
  packed-sdpa     synthetic conversations (lengths log-normal, median 600 tokens, 40% of each one assistant
                  tokens) packed by train.data.packing, position ids restarting per conversation: transformers
                  turns them into a block-diagonal mask for SDPA
  packed-flex     the same rows through FlexAttention (transformers' packed block mask)
  packed-flash    the same rows through flash-attention varlen (transformers' packed path), when installed
  padded          the same conversations, micro-batches of the same number of conversations as a packed row
                  holds on average, each padded to its longest (attention mask)
Reported per variant: median step time, row tokens/s and real (non-padding) tokens/s; the JSON compares the
packed variants with text (same tokens per step) and with padded (same conversations). Prints the JSON and
writes it to bench/results/<date>-packed.json (or --out).
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import torch

from hpc.node.cli import Parser, whole

ROOT = Path(__file__).resolve().parent.parent


def conversations(n_tokens: int, seq: int, vocab: int, seed: int = 0):
    """Synthetic conversations adding up to about ``n_tokens``: (ids, targets) with the last 40% as targets."""
    from train.data.formats import Sample

    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < n_tokens:
        n = int(np.clip(rng.lognormal(np.log(600), 0.8), 64, seq))
        targets = np.zeros(n, dtype=bool)
        targets[int(0.6 * n) :] = True
        out.append(Sample(rng.integers(10, vocab, n).astype(np.int32), targets))
        total += n
    return out


def timed(step, warmup: int, steps: int, device: torch.device) -> list[float]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="1.7B")
    p.add_argument("--seq", type=whole(1), default=4096)
    p.add_argument("--rows", type=whole(1), default=8)
    p.add_argument("--warmup-steps", type=whole(0), default=3)
    p.add_argument("--timed-steps", type=whole(1), default=8)
    p.add_argument("--out", type=Path)
    p.add_argument("--device", default="cuda", help="cuda; cpu only checks the script (e.g. --shape tiny --seq 256)")
    a = p.parse_args()

    from train.data.packing import IGNORE, model_inputs, pack
    from train.data.tokenizer import load_tokenizer
    from train.front.config import ModelConfig
    from train.model import Qwen3ForTraining, hf_config

    device = torch.device(a.device)
    config = hf_config(ModelConfig(shape=a.shape), load_tokenizer(None))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with device:
        model = Qwen3ForTraining(config).to(torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")

    seq, rows = a.seq, a.rows
    samples = conversations(rows * seq * (a.warmup_steps + a.timed_steps + 2), seq, config.vocab_size)
    tokens, flags, stats = pack(samples, seq, "truncate", 0)
    packed = [tuple(t.to(device) for t in model_inputs(tokens[i : i + 1], flags[i : i + 1])) for i in range(stats.rows)]
    per_row = stats.samples / stats.rows
    gen = torch.Generator().manual_seed(1)
    text = torch.randint(10, config.vocab_size, (stats.rows, seq + 1), generator=gen).to(device)

    # padded: the conversations in a shuffled order, micro-batches of round(per_row) each padded to its longest
    order = list(range(len(samples)))
    np.random.default_rng(2).shuffle(order)
    k = max(1, round(per_row))
    padded = []
    for i in range(0, len(order) - k + 1, k):
        group = [samples[j] for j in order[i : i + k]]
        longest = max(len(s.ids) for s in group)
        ids = torch.zeros(k, longest, dtype=torch.long)
        labels = torch.full((k, longest), IGNORE, dtype=torch.long)
        mask = torch.zeros(k, longest, dtype=torch.long)
        for r, s in enumerate(group):
            n = len(s.ids)
            ids[r, :n] = torch.from_numpy(s.ids.astype(np.int64))
            labels[r, : n - 1] = torch.where(torch.from_numpy(s.targets[1:]), ids[r, 1:n], IGNORE)
            mask[r, :n] = 1
        padded.append((ids.to(device), labels.to(device), mask.to(device)))

    cursor = {"i": 0}

    def step_over(micro, forward):
        def step():
            for _ in range(rows):
                mb = micro[cursor["i"] % len(micro)]
                cursor["i"] += 1
                count = (mb[1] != IGNORE).sum().clamp(min=1)
                (forward(mb) / count).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    def text_forward(mb):
        return model(input_ids=mb[0], labels=mb[1], reduction="sum")

    def packed_forward(mb):
        return model(input_ids=mb[0], labels=mb[1], position_ids=mb[2], reduction="sum")

    def padded_forward(mb):
        return model(input_ids=mb[0], labels=mb[1], attention_mask=mb[2], reduction="sum")

    def set_attention(name: str) -> bool:
        try:
            model.set_attn_implementation(name)
            return True
        except (ImportError, ValueError, RuntimeError) as e:
            results[f"{name}_unavailable"] = str(e).splitlines()[0][:200]
            return False

    results: dict = {}
    variants = [
        ("text", "sdpa", [(t[None, :-1], t[None, 1:]) for t in text], text_forward, seq * rows, seq * rows),
        ("packed-sdpa", "sdpa", packed, packed_forward, seq * rows, stats.tokens / stats.rows * rows),
        ("packed-flex", "flex_attention", packed, packed_forward, seq * rows, stats.tokens / stats.rows * rows),
        ("packed-flash", "flash_attention_2", packed, packed_forward, seq * rows, stats.tokens / stats.rows * rows),
    ]
    for name, attn, micro, forward, row_tokens, real_tokens in variants:
        if not set_attention(attn):
            continue
        cursor["i"] = 0
        try:
            times = timed(step_over(micro, forward), a.warmup_steps, a.timed_steps, device)
        except (NotImplementedError, RuntimeError) as e:  # a kernel this device or build lacks
            opt.zero_grad(set_to_none=True)
            results[name] = {"attention": attn, "error": str(e).splitlines()[0][:200]}
            continue
        med = statistics.median(times)
        results[name] = {
            "attention": attn,
            "step_s": med,
            "step_s_min": min(times),
            "step_s_max": max(times),
            "row_tokens_per_s": row_tokens / med,
            "real_tokens_per_s": real_tokens / med,
        }
        print(json.dumps({name: results[name]}), flush=True)
    set_attention("sdpa")
    cursor["i"] = 0
    pad_real = [int(mb[2].sum()) for mb in padded]
    try:
        pad_times = timed(step_over(padded, padded_forward), a.warmup_steps, a.timed_steps, device)
    except RuntimeError as e:  # out of memory: report it instead of a figure
        results["padded"] = {"error": str(e).splitlines()[0][:200], "conversations_per_micro_batch": k}
        pad_times = None
    n_timed = a.timed_steps * rows
    real = sum(pad_real[(a.warmup_steps * rows + j) % len(padded)] for j in range(n_timed)) / a.timed_steps
    med = statistics.median(pad_times) if pad_times else float("nan")
    results["padded"] = results.get("padded") or {
        "attention": "sdpa",
        "conversations_per_micro_batch": k,
        "step_s": med,
        "step_s_min": min(pad_times),
        "step_s_max": max(pad_times),
        "real_tokens_per_s": real / med,
        "padding_share": 1 - sum(pad_real) / sum(int(mb[2].numel()) for mb in padded),
    }
    packed_names = [n for n in ("packed-sdpa", "packed-flex", "packed-flash") if "step_s" in results.get(n, {})]
    best = max(packed_names, key=lambda n: results[n]["real_tokens_per_s"])
    out = {
        "bench": "packed_bench",
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": a.shape,
        "seq": seq,
        "rows_per_step": rows,
        "packing": {
            "conversations": stats.samples,
            "rows": stats.rows,
            "efficiency": stats.efficiency(seq),
            "per_row": per_row,
        },
        "variants": results,
        "best_packed": best,
        "packed_vs_text_row_tokens": results[best]["row_tokens_per_s"] / results["text"]["row_tokens_per_s"],
        "packed_vs_padded_real_tokens": results[best]["real_tokens_per_s"]
        / results["padded"].get("real_tokens_per_s", float("nan")),
    }
    text_out = json.dumps(out, indent=1)
    print(text_out)
    target = a.out or ROOT / "bench" / "results" / f"{out['date']}-packed.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text_out + "\n")


if __name__ == "__main__":
    main()
