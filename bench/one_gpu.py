"""What the one-GPU benchmarks share: the trainer on one rank, timing a step function, and printing the report."""

from __future__ import annotations

import json
import time
from pathlib import Path


def one_rank_trainer(cfg, run_id: str = "bench"):
    """``train.loop.Trainer`` for ``cfg`` on one rank (a process group of its own); returns it with its start-up
    seconds."""
    from train.loop import Trainer
    from train.parallel import ParallelDims, WorldEnv, init_distributed

    env = WorldEnv(rank=0, local_rank=0, world_size=1, local_world_size=1)
    device = init_distributed(env)
    dims = ParallelDims.build(cfg.parallel, env, kv_heads=cfg.model.kv_heads(), num_experts=cfg.model.num_experts())
    t0 = time.perf_counter()
    trainer = Trainer(cfg, dims, env, device, run_id=run_id)
    return trainer, time.perf_counter() - t0


def timed(step, warmup: int, steps: int) -> tuple[float, float]:
    """Run ``step()`` ``warmup`` then ``steps`` times; (seconds of the timed steps, seconds of the warm-up), each
    between device synchronizations."""
    import torch

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, warm


def peft_peer(cfg, lora: dict, checkpointing: bool = False):
    """The peer of the LoRA benchmarks on ``cfg``'s model, data and optimizer settings: transformers'
    Qwen3ForCausalLM (bf16, SDPA) + Liger (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy) + peft's LoRA with
    ``lora``'s r, alpha and target modules, fused AdamW on the adapters, gradient clipping; with ``checkpointing``
    transformers' gradient checkpointing. Returns (a step function, its start-up seconds, the list each step appends
    its loss to as a device tensor)."""
    import torch
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3ForCausalLM

    from train.data import TokenStream, load_tokenizer, load_tokens
    from train.model import hf_config

    device = torch.device("cuda")
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(None)
    apply_liger_kernel_to_qwen3(
        rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True
    )
    config = hf_config(cfg.model, tokenizer)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(
        model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"])
    )
    model.train()
    tokens = load_tokens(cfg.data, tokenizer, cache_dir=f"{cfg.log.dir}/cache")
    stream = TokenStream(tokens, cfg.seq_len, cfg.global_batch, cfg.micro_batch, 0, 1, cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optim.lr, fused=True)
    losses = []

    def step():
        ((x, _),) = stream.next_microbatches()
        x = x.to(device)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    return step, time.perf_counter() - t0, losses


def emit(report: dict, out: str | None) -> None:
    """``report`` as JSON on the output, and into the file ``out`` when one is given."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        Path(out).write_text(text)
