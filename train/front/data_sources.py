"""Reading the data source: which file, its units of work (chunks), and its records with their file and line.

A JSONL file is split into byte ranges of ``chunk_bytes``; a line belongs to the chunk in which
it starts, so the chunks do not depend on how many processes read them. A ``datasets``
directory is split into ranges of ``DATASET_ROWS_PER_CHUNK`` rows, a ``.txt`` file is one chunk.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpc.node.cli import HpcError
from hpc.node.files import regular_file_problem
from train.front.data_config import DataConfig

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEMO_CORPUS = ASSETS / "shakespeare.jsonl"
DEMO_CHAT = ASSETS / "shakespeare_chat.jsonl"
DATASET_ROWS_PER_CHUNK = 65536


class DataError(HpcError):
    """Bad data or a bad data setting; the message is one line naming the file (and line) and the key."""


@dataclass(frozen=True)
class Chunk:
    """One unit of work: bytes [start, end) of a JSONL file (lines starting there), rows [start, end) of a dataset, or
    a whole .txt."""

    index: int
    start: int
    end: int


@dataclass(frozen=True)
class Location:
    """Where a record was read: file and byte offset of its line (JSONL) or row number (datasets)."""

    path: Path
    offset: int
    row: bool = False

    def __str__(self) -> str:
        if self.row:
            return f"{self.path} row {self.offset}"
        if self.path.suffix != ".jsonl":
            return str(self.path)
        with self.path.open("rb") as f:  # counted only when an error is reported
            line = f.read(self.offset).count(b"\n") + 1
        return f"{self.path}:{line}"


def source_path(cfg: DataConfig) -> Path:
    """The configured source (the demo corpus or chat set for data.path: null), checked to exist with an allowed
    suffix."""
    if cfg.path is None:
        return DEMO_CHAT if cfg.format == "chat" else DEMO_CORPUS
    path = Path(cfg.path).expanduser().resolve()
    if not path.exists():
        raise DataError(
            f"data.path: {path} does not exist; give a .jsonl/.txt file, a datasets directory, or null for the demo "
            "data"
        )
    allowed = (".jsonl",) if cfg.format == "chat" else (".jsonl", ".txt")
    problem = None if path.is_dir() else regular_file_problem(path)
    if problem:  # a FIFO or a device would block or never end the read
        raise DataError(f"data.path: {path} is {problem}, not a regular file or a datasets directory")
    if path.is_file() and path.suffix not in allowed:
        raise DataError(
            f"data.path: {path} has suffix {path.suffix!r}; allowed: "
            f"{', '.join(allowed)}, or a datasets save_to_disk directory (with data.format={cfg.format})"
        )
    return path


def source_files(path: Path) -> list[dict]:
    """The files of a source with their sizes and modification times (for cache keys and manifests)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [{"path": str(p), "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in files]


def _load_dataset(path: Path):
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"data.path: {path} is a directory, which needs the `datasets` package (pip install -e '.[datasets]'); "
            "otherwise use a .jsonl or .txt file"
        ) from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DataError(f"data.path: {path} is a DatasetDict without a 'train' split (has {sorted(ds)})")
        ds = ds["train"]
    return ds


def chunks(path: Path, chunk_bytes: int) -> list[Chunk]:
    """The source's units of work, in order."""
    if path.is_dir():
        n = len(_load_dataset(path))
        return [
            Chunk(i, s, min(s + DATASET_ROWS_PER_CHUNK, n))
            for i, s in enumerate(range(0, max(n, 1), DATASET_ROWS_PER_CHUNK))
        ]
    if path.suffix != ".jsonl":
        return [Chunk(0, 0, path.stat().st_size)]
    size = path.stat().st_size
    return [Chunk(i, s, min(s + chunk_bytes, size)) for i, s in enumerate(range(0, max(size, 1), chunk_bytes))]


def _jsonl_records(path: Path, chunk: Chunk) -> Iterator[tuple[Location, dict]]:
    with path.open("rb") as f:
        pos = chunk.start
        if pos > 0:  # skip the line that began in the previous chunk
            f.seek(pos - 1)
            pos += len(f.readline()) - 1
        while pos < chunk.end:
            line = f.readline()
            if not line:
                break
            where, pos = Location(path, pos), pos + len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (
                ValueError,
                RecursionError,
            ) as e:  # also a number of over 4300 digits, or nesting deeper than Python's stack
                why = getattr(e, "msg", None) or (
                    "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0][:120]
                )
                raise DataError(f"data.path: {where} is not valid JSON ({why})") from None
            if not isinstance(record, dict):
                raise DataError(f"data.path: {where} is not a JSON object")
            yield where, record


def records(path: Path, chunk: Chunk, text_field: str) -> Iterator[tuple[Location, dict]]:
    """The records of one chunk with their locations; a .txt file is one record {text_field: its text}."""
    if path.is_dir():
        ds = _load_dataset(path).select(range(chunk.start, chunk.end))
        for i, record in enumerate(ds):
            yield Location(path, chunk.start + i, row=True), record
    elif path.suffix == ".jsonl":
        yield from _jsonl_records(path, chunk)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"data.path: {path} is not UTF-8 text (byte {e.start}); give a text file in UTF-8"
            ) from None
        yield Location(path, 0), {text_field: text}
