"""Training data: sources, formats (text, chat), packing by document, prepared shards, per-rank streams.

The package's names load their module on first use; the config model and the source check, read by the login side
without torch, live in ``train.front.data_config`` and ``train.front.data_sources``.
"""

import importlib

_HOMES = {
    "DataConfig": "train.front.data_config",
    "DEMO_CHAT": "train.front.data_sources",
    "DEMO_CORPUS": "train.front.data_sources",
    "DataError": "train.front.data_sources",
    "PackedStream": "train.data.stream",
    "TokenStream": "train.data.stream",
    "load_tokens": "train.data.text",
    "load_tokenizer": "train.data.tokenizer",
}

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
