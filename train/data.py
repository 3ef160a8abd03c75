"""Training data: read documents, tokenize them once (cached), and stream packed blocks.

``load_tokens`` turns a corpus into one 1-D token tensor (each document followed by
EOS). ``TokenStream`` cuts it into blocks of ``seq_len + 1`` tokens and hands each
data-parallel rank its share of every global batch, deterministically and resumably.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pydantic
import torch

from train.tokenizer import load_tokenizer

__all__ = ["DEMO_CORPUS", "DataConfig", "TokenStream", "load_tokenizer", "load_tokens"]

DEMO_CORPUS = Path(__file__).resolve().parent / "assets" / "shakespeare.jsonl"
_TOKENIZE_BATCH = 256
_CACHE_FORMAT = 1


class DataConfig(pydantic.BaseModel, extra="forbid"):
    """Where the training text comes from and how it is tokenized.

    path: a JSONL file (one JSON object per line, text under ``text_field``), a plain
    ``.txt`` file (the whole file is one document), or a directory written by
    ``datasets.Dataset.save_to_disk`` (needs the ``datasets`` package; a DatasetDict
    uses its ``train`` split). None = the shipped demo corpus (16 Shakespeare works).
    tokenizer: a Hugging Face tokenizer directory; None = the shipped demo tokenizer.
    """

    path: str | None = None
    text_field: str = "text"
    tokenizer: str | None = None


def _source_path(cfg: DataConfig) -> Path:
    path = DEMO_CORPUS if cfg.path is None else Path(cfg.path).expanduser().resolve()
    if not path.exists():
        raise ValueError(
            f"data.path: {path} does not exist; give a .jsonl/.txt file, a datasets directory, or null for the demo corpus"
        )
    if path.is_file() and path.suffix not in (".jsonl", ".txt"):
        raise ValueError(
            f"data.path: {path} has suffix {path.suffix!r}; allowed: .jsonl, .txt, or a datasets save_to_disk directory"
        )
    return path


def _read_jsonl(path: Path, text_field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"data.path: {path}:{line_no} is not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise ValueError(
                    f"data.text_field: {path}:{line_no} has no string field {text_field!r}; "
                    "set data.text_field to the key holding the text"
                )
            yield record[text_field]


def _read_dataset_dir(path: Path, text_field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"data.path: {path} is a directory, which needs the `datasets` package (pip install -e '.[datasets]'); "
            "otherwise use a .jsonl or .txt file"
        ) from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"data.path: {path} is a DatasetDict without a 'train' split (has {sorted(ds)})")
        ds = ds["train"]
    if text_field not in ds.column_names:
        raise ValueError(f"data.text_field: {path} has no column {text_field!r}; columns: {ds.column_names}")
    for batch in ds.select_columns([text_field]).iter(batch_size=_TOKENIZE_BATCH):
        yield from batch[text_field]


def _read_documents(path: Path, text_field: str) -> Iterator[str]:
    """Yield the documents of a .jsonl file, a .txt file (one document) or a datasets directory."""
    if path.is_dir():
        yield from _read_dataset_dir(path, text_field)
    elif path.suffix == ".jsonl":
        yield from _read_jsonl(path, text_field)
    else:
        yield path.read_text(encoding="utf-8")


def _tokenize(documents: Iterator[str], tokenizer) -> torch.Tensor:
    eos = tokenizer.eos_token_id
    chunks: list[torch.Tensor] = []

    def flush(batch: list[str]) -> None:
        ids = tokenizer(batch, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
        chunks.extend(torch.tensor(doc + [eos], dtype=torch.int64) for doc in ids)

    batch: list[str] = []
    for doc in documents:
        batch.append(doc)
        if len(batch) == _TOKENIZE_BATCH:
            flush(batch)
            batch = []
    if batch:
        flush(batch)
    return torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.int64)


def _cache_key(path: Path, text_field: str, tokenizer) -> str:
    """Hash of the source files' (path, size, mtime), the text field and the tokenizer."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    source = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
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
    path = _source_path(cfg)
    target = None
    if cache_dir is not None:
        target = Path(cache_dir) / f"tokens-{_cache_key(path, cfg.text_field, tokenizer)}.pt"
        if target.is_file():
            return torch.load(target, mmap=True, weights_only=True)
    tokens = _tokenize(_read_documents(path, cfg.text_field), tokenizer)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        _save_atomic(tokens, target)
    return tokens


def _epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class TokenStream:
    """Deterministic, resumable stream of packed blocks for one data-parallel rank.

    The tokens are cut into ``num_blocks`` blocks of ``seq_len + 1`` tokens (tail
    dropped). Each epoch visits the blocks in a permutation fixed by (seed, epoch); every
    global step takes the next ``global_batch`` blocks of it, and an epoch ends when fewer
    than ``global_batch`` blocks remain. Rank ``r`` gets the ``r``-th contiguous slice of
    ``global_batch // dp_size`` blocks, as micro-batches of ``micro_batch``. The state
    (epoch, samples consumed in the epoch) does not depend on dp_size or micro_batch, so
    a run may resume under another layout without repeating or skipping samples.
    ``last_sample_ids`` lists the global block ids this rank took in the last step.
    """

    def __init__(
        self, tokens: torch.Tensor, seq_len: int, global_batch: int, micro_batch: int, dp_rank: int, dp_size: int, seed: int
    ):
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be a 1-D tensor, got shape {tuple(tokens.shape)}")
        if min(seq_len, global_batch, micro_batch, dp_size) < 1:
            raise ValueError(
                f"seq_len, global_batch, micro_batch and dp_size must be >= 1, "
                f"got {seq_len}, {global_batch}, {micro_batch}, {dp_size}"
            )
        if global_batch % (micro_batch * dp_size):
            raise ValueError(
                f"global_batch={global_batch} must be divisible by "
                f"micro_batch*dp_size={micro_batch}*{dp_size}={micro_batch * dp_size}"
            )
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
        self.num_blocks = tokens.numel() // (seq_len + 1)
        if self.num_blocks < global_batch:
            raise ValueError(
                f"corpus too small: {tokens.numel()} tokens make {self.num_blocks} blocks of seq_len+1={seq_len + 1}, "
                f"fewer than global_batch={global_batch}; use more data or a smaller seq_len/global_batch"
            )
        self.blocks = tokens[: self.num_blocks * (seq_len + 1)].view(self.num_blocks, seq_len + 1)
        self.seq_len, self.global_batch, self.micro_batch = seq_len, global_batch, micro_batch
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.steps_per_epoch = self.num_blocks // global_batch
        self.epoch, self.consumed = 0, 0
        self.last_sample_ids: list[int] = []
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.int64)

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.epoch:
            gen = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
            self._perm, self._perm_epoch = torch.randperm(self.num_blocks, generator=gen), self.epoch
        return self._perm

    def next_microbatches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's (input_ids, labels) micro-batches for the next global step."""
        if self.consumed + self.global_batch > self.num_blocks:
            self.epoch, self.consumed = self.epoch + 1, 0
        share = self.global_batch // self.dp_size
        start = self.consumed + self.dp_rank * share
        ids = self._permutation()[start : start + share]
        self.consumed += self.global_batch
        self.last_sample_ids = ids.tolist()
        out = []
        for mb in ids.split(self.micro_batch):
            block = self.blocks[mb].long()
            out.append((block[:, :-1].contiguous(), block[:, 1:].contiguous()))
        return out

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_blocks": self.num_blocks,
        }

    def load_state_dict(self, d: dict) -> None:
        for key in ("seed", "seq_len", "num_blocks"):
            if d[key] != getattr(self, key):
                raise ValueError(
                    f"data state {key}={d[key]} does not match this stream's {key}={getattr(self, key)}; "
                    "resume with the same data, seq_len and seed"
                )
        if not 0 <= d["consumed"] <= self.num_blocks:
            raise ValueError(f"data state consumed={d['consumed']} must be in [0, num_blocks={self.num_blocks}]")
        self.epoch, self.consumed = int(d["epoch"]), int(d["consumed"])
