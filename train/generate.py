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

from hpc.node.cli import HpcError, Parser, fail, path_text, shown, whole
from hpc.node.files import META_BYTES, read_json_object
from train.adapters import ADAPTER_CONFIG

PROG = "train.generate"


def model_config(model_dir: str | Path) -> dict:
    """A model directory's config.json (a small regular JSON object), before transformers reads it."""
    if not Path(model_dir).is_dir():
        raise HpcError(f"{model_dir} is not a directory; give an exported model directory")
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise HpcError(f"{model_dir} is not an exported model directory (no config.json or {ADAPTER_CONFIG})")
    try:
        return read_json_object(path, META_BYTES)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).replace(f"{path} ", "it ")
        raise HpcError(f"{model_dir}: config.json cannot be read ({why})") from None


def load(model_dir: str | Path, base: str | Path | None = None):
    """(tokenizer, model in eval mode) of a Hugging Face directory, or of a PEFT adapter directory on its base; a
    directory they cannot be loaded from is one HpcError line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_config = Path(model_dir) / ADAPTER_CONFIG
    try:
        if not adapter_config.exists():
            if base is not None:
                raise HpcError(
                    f"--base {base}: {model_dir} is a full model, not a LoRA adapter (no {ADAPTER_CONFIG}); "
                    "--base applies to an adapter directory only"
                )
            model_config(model_dir)
            return (
                AutoTokenizer.from_pretrained(model_dir, local_files_only=True),
                AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval(),
            )
        saved = read_json_object(adapter_config, META_BYTES).get("base_model_name_or_path")
        base = base or saved
        if not isinstance(base, str) or not base or not (Path(base) / "config.json").is_file():
            raise HpcError(
                f"{model_dir} is a LoRA adapter whose base {shown(base)} is not a model directory: give --base DIR"
            )
        model_config(base)
        try:
            from peft import PeftModel
        except ImportError:
            raise HpcError(f"{model_dir} is a LoRA adapter: loading it needs peft (pip install peft)") from None
        model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base, local_files_only=True), model_dir
        ).eval()
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True), model
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise HpcError(
            f"{model_dir}: cannot load the model or its tokenizer ({' '.join(str(e).split())[:300]})"
        ) from None


def generate(
    model_dir: str | Path, prompt: str, tokens: int = 40, seed: int = 0, base: str | Path | None = None
) -> str:
    """The prompt continued by `tokens` sampled tokens (temperature 0.8, top-k 50)."""
    tok, model = load(model_dir, base)
    torch.manual_seed(seed)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=tokens, do_sample=True, temperature=0.8, top_k=50, pad_token_id=tok.pad_token_id
        )
    return tok.decode(out[0], skip_special_tokens=True)


def chat(
    model_dir: str | Path,
    message: str,
    tokens: int = 60,
    seed: int = 0,
    enable_thinking: bool = False,
    base: str | Path | None = None,
) -> str:
    """The assistant's answer to one user message, through the chat template (greedy)."""
    tok, model = load(model_dir, base)
    if not tok.chat_template:
        raise HpcError(f"{model_dir}: the tokenizer has no chat template; use --prompt")
    torch.manual_seed(seed)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": message}],
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


MAX_TOKENS = 100_000


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    p.add_argument("model_dir", type=path_text)
    text = p.add_mutually_exclusive_group()
    text.add_argument("--prompt", default="ROMEO:")
    text.add_argument("--chat", metavar="MESSAGE", help="a user message, answered through the chat template")
    p.add_argument("--tokens", type=whole(1, MAX_TOKENS), default=40)
    p.add_argument(
        "--base", type=path_text, help="a LoRA adapter's base model directory (default: its adapter_config.json's)"
    )
    a = p.parse_args(argv)
    try:
        if a.chat is None and not a.prompt:
            raise HpcError("--prompt: an empty prompt; give some text to continue")
        if a.chat is not None and not a.chat.strip():
            raise HpcError("--chat: an empty message")
        print(
            generate(a.model_dir, a.prompt, a.tokens, base=a.base)
            if a.chat is None
            else chat(a.model_dir, a.chat, a.tokens, base=a.base)
        )
    except HpcError as e:
        fail(PROG, e)


if __name__ == "__main__":
    main()
