"""Training data: sources, formats (text, chat), packing by document, prepared shards, per-rank streams."""

from hpc.train.data.config import DataConfig
from hpc.train.data.sources import DEMO_CHAT, DEMO_CORPUS, DataError
from hpc.train.data.stream import PackedStream, TokenStream
from hpc.train.data.text import load_tokens
from hpc.train.tokenizer import load_tokenizer

__all__ = ["DEMO_CHAT", "DEMO_CORPUS", "DataConfig", "DataError", "PackedStream", "TokenStream", "load_tokenizer", "load_tokens"]
