"""The tokenizer's files, checked without transformers: the shipped demo tokenizer or any Hugging Face tokenizer
directory (``train.data.tokenizer`` loads it on the ranks).

``DataConfig.tokenizer: null`` loads the demo tokenizer in ``train/assets/tokenizer``
(a 2048-token byte-level BPE trained on the demo corpus by
``scripts/make_demo_assets.py``; EOS = ``<|endoftext|>``).

To train with the real Qwen3 vocabulary, point ``tokenizer:`` at a local directory
holding its files (``tokenizer.json``, ``tokenizer_config.json``, and optionally
``vocab.json``/``merges.txt``), e.g. one fetched on a machine with hub access by
``hf download Qwen/Qwen3-0.6B tokenizer.json tokenizer_config.json vocab.json merges.txt
--local-dir /shared/tokenizers/qwen3``; the model's ``vocab_size`` must cover it.
Any directory that ``AutoTokenizer.from_pretrained`` loads as a fast tokenizer works.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpc.node.cli import HpcError
from hpc.node.files import META_BYTES, read_small_text, regular_file_problem

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
DEMO_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
# The demo tokenizer plus Qwen3's chat tokens (<|im_start|>, <|im_end|> = EOS, <think>, </think>) and a Qwen3-style chat
# template.
DEMO_CHAT_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "chat_tokenizer"


def tokenizer_source(data_tokenizer: str | None, model_path: str | None, chat: bool) -> str:
    """data.tokenizer, else model.path's tokenizer, else the demo tokenizer (its chat variant for chat data)."""
    if data_tokenizer or model_path:
        return data_tokenizer or model_path
    return str(DEMO_CHAT_TOKENIZER_DIR if chat else DEMO_TOKENIZER_DIR)


def tokenizer_dir(path: str | None) -> Path:
    """The tokenizer directory of ``path`` (None = the demo tokenizer), checked to hold a Hugging Face tokenizer's
    files."""
    directory = DEMO_TOKENIZER_DIR if path is None else Path(path).expanduser()
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise HpcError(
            f"tokenizer: {directory} is not a Hugging Face tokenizer directory "
            "(need tokenizer.json or tokenizer_config.json); use null for the demo tokenizer"
        )
    for name in TOKENIZER_FILES:  # transformers reads each that is there: a FIFO would block it
        problem = regular_file_problem(directory / name)
        if problem:
            raise HpcError(f"tokenizer: {directory / name} is {problem}, not a regular file")
    return directory


def load_error(directory: Path, e: Exception) -> HpcError:
    """The one line for a tokenizer directory whose files do not load (``e``: the parser's error)."""
    return HpcError(f"tokenizer: {directory} cannot be loaded ({' '.join(str(e).split())[:200] or type(e).__name__})")


def check_tokenizer(path: str | None) -> int | None:
    """The torch-free part of ``train.data.tokenizer.load_tokenizer``'s checks (the login side runs it for every job):
    the directory's files, and its tokenizer.json and tokenizer_config.json parsed. Returns the vocabulary with added
    tokens (``len`` of the loaded tokenizer) when tokenizer.json gives it, else None."""
    from tokenizers import Tokenizer

    directory = tokenizer_dir(path)
    try:
        config = directory / "tokenizer_config.json"
        if config.is_file() and not isinstance(json.loads(read_small_text(config, META_BYTES)), dict):
            raise ValueError("tokenizer_config.json is not a JSON object")
        if (directory / "tokenizer.json").is_file():
            return Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    except Exception as e:  # the user's files: a broken JSON, a tokenizers parse error
        raise load_error(directory, e) from None
    return None
