"""HF in, HF out: training starts from a local sharded HF Qwen3 directory with a chat template (each rank reading only
its slices), under dp2 x tp2, exactly (the first step's loss equals the HF model's on the same batch); the export loads
with AutoModelForCausalLM, keeps the tokenizer, chat template and generation config, and answers through the
template."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from train_helpers import finish, launch, metrics
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from train.data.packing import IGNORE
from train.data.prepared import PreparedData, describe, split_rows
from train.data.stream import PackedStream
from train.data.tokenizer import load_tokenizer
from train.front.data_config import DataConfig
from train.front.data_sources import DEMO_CHAT
from train.front.tokenizer import DEMO_CHAT_TOKENIZER_DIR
from train.generate import chat

SEQ, BATCH = 64, 8


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "qwen3-chat"
    tok = load_tokenizer(str(DEMO_CHAT_TOKENIZER_DIR))
    config = Qwen3Config(
        vocab_size=2112,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(3)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out, max_shard_size="200KB")
    tok.save_pretrained(out)
    assert len(list(out.glob("model-*.safetensors"))) > 1 and (out / "model.safetensors.index.json").is_file()
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory, hf_dir):
    run = tmp_path_factory.mktemp("from_hf")
    held_out = run.parent / "held_out.jsonl"
    with DEMO_CHAT.open() as f:
        held_out.write_text("".join(next(f) for _ in range(40)))
    overrides = (
        "model.shape=null",
        f"model.path={hf_dir}",
        "data.format=chat",
        f"seq_len={SEQ}",
        f"global_batch={BATCH}",
        "micro_batch=2",
        "parallel.tp=2",
        "steps=1",
        "schedule.warmup_steps=0",
        "checkpoint.interval=0",
        "export=hf",
        f"eval.path={held_out}",
        "eval.every=1",
    )
    finish(launch(4, run, *overrides), run)
    return run


def test_first_step_loss_equals_the_hf_model_on_the_same_batch(run, hf_dir):
    tok = load_tokenizer(str(hf_dir))
    cfg = DataConfig(format="chat")
    data = PreparedData(run / "data", describe(cfg, SEQ, tok), "-")
    stream = PackedStream(data, split_rows(data.num_rows, 0.0)[0], BATCH, BATCH, 0, 1, seed=0)
    ((input_ids, labels, positions),) = stream.next_microbatches()
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=input_ids, position_ids=positions).logits
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE).item()
    got = metrics(run)[1]
    print(
        f"first step from the sharded HF directory under dp2 x tp2: {got['loss']:.6f}, "
        f"HF model on the batch: {expected:.6f}"
    )
    assert got["loss_tokens"] == int((labels != IGNORE).sum())
    assert abs(got["loss"] - expected) < 1e-5
    assert (run / "data" / "eval" / "manifest.json").is_file() and got["eval_loss"] > 0  # eval.path, prepared apart


def test_export_keeps_tokenizer_template_and_generation_config_and_chats(run):
    hf = run / "hf"
    model = AutoModelForCausalLM.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(hf).eos_token_id == tok.eos_token_id == model.config.eos_token_id
    answer = chat(hf, "Who is Hamlet?", tokens=8)
    assert isinstance(answer, str) and "<|im_start|>" not in answer
