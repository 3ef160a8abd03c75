"""python -m train.generate DIR [--prompt TEXT] [--tokens N]: sample from an exported model.

DIR is a Hugging Face directory (the trainer's ``export``); it is loaded with
``AutoModelForCausalLM`` / ``AutoTokenizer`` exactly as any inference stack would.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


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


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m train.generate", description=__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--tokens", type=int, default=40)
    a = p.parse_args()
    if not (Path(a.model_dir) / "config.json").is_file():
        print(f"train.generate: error: {a.model_dir} is not an exported model directory (no config.json)", file=sys.stderr)
        sys.exit(2)
    print(generate(a.model_dir, a.prompt, a.tokens))


if __name__ == "__main__":
    main()
