"""python -m train.generate DIR [--prompt TEXT | --chat MESSAGE] [--tokens N]: sample from an exported model.

DIR is a Hugging Face directory (the trainer's ``export``); it is loaded with
``AutoModelForCausalLM`` / ``AutoTokenizer`` exactly as any inference stack would. A PEFT adapter
directory (a LoRA run's export: adapter_config.json) is loaded with ``peft.PeftModel`` onto its
base (``base_model_name_or_path``, or ``--base``).
``--chat`` sends MESSAGE as a user turn through the tokenizer's chat template and prints the
assistant's answer (generation stops at the model's EOS, ``<|im_end|>`` for Qwen3 chat).
"""
from __future__ import annotations

from pathlib import Path

import torch

from hpc.node.cli import HpcError, Parser, fail

PROG = "train.generate"


def load(model_dir: str | Path, base: str | Path | None = None):
    """(tokenizer, model in eval mode) of a Hugging Face directory, or of a PEFT adapter directory on its base."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.adapters import ADAPTER_CONFIG

    adapter_config = Path(model_dir) / ADAPTER_CONFIG
    if not adapter_config.is_file():
        if not (Path(model_dir) / "config.json").is_file():
            raise HpcError(f"{model_dir} is not an exported model directory (no config.json or adapter_config.json)")
        return AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir).eval()
    base = base or json.loads(adapter_config.read_text()).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise HpcError(f"{model_dir} is a LoRA adapter whose base {base!r} is not a model directory: give --base DIR")
    try:
        from peft import PeftModel
    except ImportError:
        raise HpcError(f"{model_dir} is a LoRA adapter: loading it needs peft (pip install peft)") from None
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), model_dir).eval()
    return AutoTokenizer.from_pretrained(model_dir), model


def generate(model_dir: str | Path, prompt: str, tokens: int = 40, seed: int = 0, base: str | Path | None = None) -> str:
    """The prompt continued by `tokens` sampled tokens (temperature 0.8, top-k 50)."""
    tok, model = load(model_dir, base)
    torch.manual_seed(seed)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=True, temperature=0.8, top_k=50,
                             pad_token_id=tok.pad_token_id)
    return tok.decode(out[0], skip_special_tokens=True)


def chat(model_dir: str | Path, message: str, tokens: int = 60, seed: int = 0, enable_thinking: bool = False,
         base: str | Path | None = None) -> str:
    """The assistant's answer to one user message, through the chat template (greedy)."""
    tok, model = load(model_dir, base)
    if not tok.chat_template:
        raise HpcError(f"{model_dir}: the tokenizer has no chat template; use --prompt")
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
    p.add_argument("--base", help="a LoRA adapter's base model directory (default: its adapter_config.json's)")
    a = p.parse_args()
    try:
        print(generate(a.model_dir, a.prompt, a.tokens, base=a.base) if a.chat is None
              else chat(a.model_dir, a.chat, a.tokens, base=a.base))
    except HpcError as e:
        fail(PROG, e)


if __name__ == "__main__":
    main()
