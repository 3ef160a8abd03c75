"""python -m train.generate DIR [--prompt TEXT | --chat MESSAGE] [--tokens N]: sample from an exported model.

DIR is a Hugging Face directory (the trainer's ``export``); it is loaded with
``AutoModelForCausalLM`` / ``AutoTokenizer`` exactly as any inference stack would.
``--chat`` sends MESSAGE as a user turn through the tokenizer's chat template and prints the
assistant's answer (generation stops at the model's EOS, ``<|im_end|>`` for Qwen3 chat).
"""
from __future__ import annotations

from pathlib import Path

import torch

from hpc.node.cli import HpcError, Parser, fail

PROG = "train.generate"


def generate(model_dir: str | Path, prompt: str, tokens: int = 40, seed: int = 0) -> str:
    """The prompt continued by `tokens` sampled tokens (temperature 0.8, top-k 50)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=True, temperature=0.8, top_k=50,
                             pad_token_id=tok.pad_token_id)
    return tok.decode(out[0], skip_special_tokens=True)


def chat(model_dir: str | Path, message: str, tokens: int = 60, seed: int = 0, enable_thinking: bool = False) -> str:
    """The assistant's answer to one user message, through the chat template (greedy)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if not tok.chat_template:
        raise HpcError(f"{model_dir}: the tokenizer has no chat template; use --prompt")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    ids = tok.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                  enable_thinking=enable_thinking, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def main() -> None:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--chat", metavar="MESSAGE", help="a user message, answered through the chat template")
    p.add_argument("--tokens", type=int, default=40)
    a = p.parse_args()
    try:
        if not (Path(a.model_dir) / "config.json").is_file():
            raise HpcError(f"{a.model_dir} is not an exported model directory (no config.json)")
        print(generate(a.model_dir, a.prompt, a.tokens) if a.chat is None else chat(a.model_dir, a.chat, a.tokens))
    except HpcError as e:
        fail(PROG, e)


if __name__ == "__main__":
    main()
