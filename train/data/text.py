"""Text data as one token stream (``data.pack: stream``): every document tokenized once (cached), each followed by EOS.

``load_tokens`` turns a corpus into one 1-D token tensor; ``train.data.stream.TokenStream``
cuts it into blocks of ``seq_len + 1`` tokens that run across documents.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from hpc.node.files import read_small_text
from train.data.formats import TextFormat
from train.front.data_config import DataConfig
from train.front.data_sources import DataError, chunks, records, source_files, source_path

POLL_S = 0.5

_CACHE_FORMAT = 1


def _tokenize(cfg: DataConfig, path: Path, tokenizer) -> torch.Tensor:
    fmt = TextFormat(cfg, tokenizer)
    docs = [
        torch.from_numpy(sample.ids).long()
        for chunk in chunks(path, cfg.chunk_bytes)
        for sample in fmt.samples(records(path, chunk, cfg.text_field))
    ]
    return torch.cat(docs) if docs else torch.empty(0, dtype=torch.int64)


def _cache_key(path: Path, text_field: str, tokenizer) -> str:
    """Hash of the source files' (path, size, mtime), the text field and the tokenizer."""
    source = [(f["path"], f["size"], f["mtime_ns"]) for f in source_files(path)]
    tok = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    blob = json.dumps([_CACHE_FORMAT, source, text_field, tok, tokenizer.eos_token_id])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _save_atomic(tokens: torch.Tensor, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(tokens, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def load_tokens(cfg: DataConfig, tokenizer, cache_dir: str | None = None) -> torch.Tensor:
    """Tokenize every document of ``cfg.path``, each followed by EOS, into one 1-D int64 tensor.

    With ``cache_dir`` the result is stored as ``tokens-<key>.pt`` (written to a temp file
    and renamed, so concurrent ranks are safe) and memory-mapped on later calls.
    """
    path = source_path(cfg)
    target = None
    if cache_dir is not None:
        target = Path(cache_dir) / f"tokens-{_cache_key(path, cfg.text_field, tokenizer)}.pt"
        if target.is_file():
            return torch.load(target, mmap=True, weights_only=True)
    tokens = _tokenize(cfg, path, tokenizer)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        _save_atomic(tokens, target)
    return tokens


def load_tokens_on_rank0(cfg: DataConfig, tokenizer, cache_dir: str, rank: int) -> torch.Tensor:
    """Rank 0 fills the cache (``load_tokens``); the other ranks poll the file system for it (no collective, so
    no rank times out while rank 0 tokenizes) and memory-map it. An error on rank 0 is written beside the cache
    and raised on every rank."""
    path = source_path(cfg)
    target = Path(cache_dir) / f"tokens-{_cache_key(path, cfg.text_field, tokenizer)}.pt"
    error = target.with_suffix(".error")
    if rank == 0:
        try:
            return load_tokens(cfg, tokenizer, cache_dir)
        except DataError as e:
            error.parent.mkdir(parents=True, exist_ok=True)
            error.write_text(str(e) + "\n")
            raise
    while not target.is_file():
        if error.is_file():
            raise DataError(read_small_text(error).strip())
        time.sleep(POLL_S)
    return torch.load(target, mmap=True, weights_only=True)
