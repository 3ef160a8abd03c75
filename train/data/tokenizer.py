"""The tokenizer as the ranks load it: a fast transformers tokenizer from a directory checked by
``train.front.tokenizer`` (the demo tokenizer for None)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpc.node.cli import HpcError
from train.front.tokenizer import load_error, tokenizer_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


def load_tokenizer(path: str | None) -> PreTrainedTokenizerFast:
    """Load a fast tokenizer from ``path`` (None = demo tokenizer); it must define an EOS token."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    directory = tokenizer_dir(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as e:  # the user's files: a broken JSON, a missing vocabulary, a tokenizers parse error
        raise load_error(directory, e) from None
    if not isinstance(tok, PreTrainedTokenizerFast):
        raise HpcError(
            f"tokenizer: {directory} loads as a slow {type(tok).__name__}; a fast tokenizer (tokenizer.json) is "
            "required"
        )
    if tok.eos_token_id is None:
        raise HpcError(f"tokenizer: {directory} defines no eos_token; set eos_token in its tokenizer_config.json")
    return tok
