"""Training data: sources, formats (text, chat), packing by document, prepared shards, per-rank streams.

The package's names load their module on first use, so ``train.data.config`` and ``train.data.sources``
(the config model and the source check, read by the login side) import no torch.
"""

import importlib

_HOMES = {
    "DataConfig": "config",
    "DEMO_CHAT": "sources",
    "DEMO_CORPUS": "sources",
    "DataError": "sources",
    "PackedStream": "stream",
    "TokenStream": "stream",
    "load_tokens": "text",
}

__all__ = [*_HOMES, "load_tokenizer"]


def __getattr__(name: str):
    if name == "load_tokenizer":
        from train.tokenizer import load_tokenizer

        return load_tokenizer
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
