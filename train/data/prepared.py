"""Prepared data: samples tokenized, rendered and packed once into memory-mapped shards, with a manifest.

A prepared directory holds, per chunk of the source (``train.front.data_sources.chunks``),
``chunk-NNNNN.tokens.npy`` (int32) and ``chunk-NNNNN.flags.npy`` (uint8), both [rows, seq_len]
(see ``train.data.packing``), and ``chunk-NNNNN.json`` (its counts and the key it was made for,
written last: the chunk is done). ``manifest.json`` (written once every chunk is done, by
whichever process finished last) records the settings, the source files with sizes and
modification times, the tokenizer's hash and chat template, and every chunk's counts.
Chunks are packed independently and each is written by exactly one process, so the output is
byte-identical for any number of processes. A process that meets bad input writes
``error-<key>.txt`` (one line) so that the others stop waiting and report the same line.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hpc.node.contract import PREPARED_MANIFEST as MANIFEST
from hpc.node.files import META_BYTES, read_json_object, read_small_text
from train.data.formats import make_format
from train.data.packing import PackStats, pack
from train.front.data_config import DataConfig
from train.front.data_sources import DataError, chunks, records, source_files, source_path

FORMAT_VERSION = 2  # 2: samples without a loss token are left out (no_loss), the longest sample is recorded
POLL_S = 0.5


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary, merges, normalization and special tokens."""
    blob = json.dumps([tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, tokenizer.pad_token_id])
    return hashlib.sha256(blob.encode()).hexdigest()


def describe(cfg: DataConfig, seq_len: int, tokenizer) -> dict:
    """What the prepared data is made from and how: compared with a manifest's, key by key."""
    path = source_path(cfg)
    chat = cfg.format == "chat"
    return {
        "format_version": FORMAT_VERSION,
        "format": cfg.format,
        "field": cfg.messages_field if chat else cfg.text_field,
        "enable_thinking": cfg.enable_thinking if chat else None,
        "seq_len": seq_len,
        "overlong": cfg.overlong,
        "chunk_bytes": cfg.chunk_bytes,
        "sources": source_files(path),
        "tokenizer_sha256": tokenizer_hash(tokenizer),
        "chat_template": tokenizer.chat_template if chat else None,
    }


def key_of(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]


def _write_atomic(target: Path, write: Callable[[Path], None]) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_text(target: Path, text: str) -> None:
    _write_atomic(target, lambda p: p.write_text(text))


def _publish_manifest(out: Path, text: str, key: str) -> bool:
    """Write the manifest unless another task already published this key's; True if this task wrote it. The hard
    link is the exclusive step (atomic on local and network file systems); a stale manifest of another key is
    replaced."""
    tmp = out / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(text)
    try:
        os.link(tmp, out / MANIFEST)
        return True
    except FileExistsError:
        try:
            theirs = read_manifest(out)
        except DataError:
            theirs = None
        if theirs is not None and theirs.get("key") == key:
            return False
        os.replace(tmp, out / MANIFEST)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _save_npy(target: Path, array: np.ndarray) -> None:
    def write(p: Path) -> None:
        with p.open("wb") as f:
            np.save(f, array)

    _write_atomic(target, write)


def _chunk_done(out: Path, index: int, key: str) -> dict | None:
    try:
        info = read_json_object(out / f"chunk-{index:05d}.json", META_BYTES)
    except (OSError, ValueError):
        return None
    return info if info.get("key") == key else None


def manifest_mismatch(manifest: dict, expected: dict) -> str | None:
    """The first setting in which a manifest differs from the expected description, as 'key (was X, now Y)', or None."""
    for key, value in expected.items():
        if manifest.get(key) != value:
            was = manifest.get(key)
            if key == "sources":
                return "sources (a source file was added, removed or changed since)"
            if key in ("tokenizer_sha256", "chat_template"):
                return f"{key} (another tokenizer or chat template)"
            return f"{key} (was {was!r}, now {value!r})"
    return None


def read_manifest(out: Path) -> dict | None:
    try:
        return read_json_object(out / MANIFEST, META_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        raise DataError(f"data.prepared: {out / MANIFEST} is corrupt; delete {out} and prepare again") from None


def prepare(
    cfg: DataConfig,
    seq_len: int,
    tokenizer,
    tokenizer_name: str,
    out: Path,
    rank: int = 0,
    world: int = 1,
    log: Callable[[str], None] = print,
) -> dict | None:
    """Prepare this process's share of the chunks (index % world == rank) into ``out``; the process that completes
    the last chunk writes the manifest and gets it back (the others get None; of tasks finishing together, one).
    Chunks already done for the same key are kept, so an interrupted preparation resumes."""
    expected = describe(cfg, seq_len, tokenizer)
    key = key_of(expected)
    out.mkdir(parents=True, exist_ok=True)
    path = source_path(cfg)
    work = chunks(path, cfg.chunk_bytes)
    fmt = make_format(cfg, tokenizer, tokenizer_name)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    t0, cpu0 = time.perf_counter(), time.process_time()
    mine = [c for c in work if c.index % world == rank]
    try:
        for chunk in mine:
            if _chunk_done(out, chunk.index, key):
                continue
            tokens, flags, stats = pack(fmt.samples(records(path, chunk, cfg.text_field)), seq_len, cfg.overlong, pad)
            stem = out / f"chunk-{chunk.index:05d}"
            _save_npy(stem.with_suffix(".tokens.npy"), tokens)
            _save_npy(stem.with_suffix(".flags.npy"), flags)
            info = {"key": key, "index": chunk.index, "source_range": [chunk.start, chunk.end], **stats.__dict__}
            _write_text(stem.with_suffix(".json"), json.dumps(info, sort_keys=True) + "\n")
    except DataError as e:
        _write_text(out / f"error-{key}.txt", str(e) + "\n")
        raise
    log(
        f"[prepare] task {rank}/{world}: {len(mine)} of {len(work)} chunks of {path} in "
        f"{time.perf_counter() - t0:.1f}s "
        f"(cpu {time.process_time() - cpu0:.1f}s)"
    )
    done = [_chunk_done(out, c.index, key) for c in work]
    if any(d is None for d in done):
        return None
    total = PackStats()
    for d in done:
        total.add(PackStats(**{k: d[k] for k in PackStats.__dataclass_fields__}))
    refusal = total.no_loss_refusal(seq_len, cfg.overlong)
    if refusal:
        _write_text(out / f"error-{key}.txt", refusal + "\n")
        raise DataError(refusal)
    fields = ("index", "rows", "samples", "tokens", "loss_tokens", "truncated", "dropped", "no_loss", "longest")
    manifest = {
        **expected,
        "key": key,
        "chunks": [{k: d[k] for k in fields} for d in done],
        "totals": {**total.__dict__, "packing_efficiency": round(total.efficiency(seq_len), 6)},
    }
    return manifest if _publish_manifest(out, json.dumps(manifest, indent=1, sort_keys=True) + "\n", key) else None


def wait_until_prepared(out: Path, expected: dict) -> dict:
    """Poll (no collective) until ``out`` holds a manifest for ``expected``; a task's error is raised here too. A task
    that dies ends the job (srun, torchrun), so the wait has no bound of its own."""
    key = key_of(expected)
    while True:
        error = out / f"error-{key}.txt"
        if error.is_file():
            raise DataError(read_small_text(error).strip())
        manifest = read_manifest(out)
        if manifest is not None and manifest.get("key") == key:
            return manifest
        time.sleep(POLL_S)


class PreparedData:
    """The packed rows of a prepared directory, memory-mapped: memory does not grow with the corpus."""

    def __init__(self, out: Path, expected: dict, how_to_prepare: str):
        manifest = read_manifest(out)
        if manifest is None:
            raise DataError(f"data.prepared: {out} is not prepared; run {how_to_prepare}")
        mismatch = manifest_mismatch(manifest, expected)
        if mismatch:
            raise DataError(
                f"data.prepared: {out} was prepared with another {mismatch}; run {how_to_prepare} "
                "(it prepares again), or point data.prepared elsewhere"
            )
        self.manifest, self.seq_len = manifest, expected["seq_len"]
        self.tokens, self.flags = [], []
        for c in manifest["chunks"]:
            stem = out / f"chunk-{c['index']:05d}"
            try:
                tokens = np.load(stem.with_suffix(".tokens.npy"), mmap_mode="r")
                flags = np.load(stem.with_suffix(".flags.npy"), mmap_mode="r")
            except (OSError, ValueError) as e:
                raise DataError(
                    f"data.prepared: {stem}.*.npy is missing or corrupt ({e}); run {how_to_prepare}"
                ) from None
            shape = (c["rows"], self.seq_len)
            if tokens.shape != shape or flags.shape != shape or tokens.dtype != np.int32 or flags.dtype != np.uint8:
                raise DataError(
                    f"data.prepared: {stem}.*.npy holds {tokens.shape} {tokens.dtype} / {flags.shape} {flags.dtype}, "
                    f"the manifest says {shape} int32 / uint8; run {how_to_prepare}"
                )
            self.tokens.append(tokens)
            self.flags.append(flags)
        self.offsets = np.cumsum([0] + [c["rows"] for c in manifest["chunks"]])
        self.num_rows = int(self.offsets[-1])

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and flags [len(ids), seq_len] of global row ids."""
        chunk = np.searchsorted(self.offsets, ids, side="right") - 1
        local = ids - self.offsets[chunk]
        tokens = np.stack([self.tokens[c][r] for c, r in zip(chunk, local, strict=False)])
        flags = np.stack([self.flags[c][r] for c, r in zip(chunk, local, strict=False)])
        return tokens, flags


def split_rows(num_rows: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, eval) row ids: a row is held out when its golden-ratio hash falls below ``fraction``; fixed by the data
    alone."""
    ids = np.arange(num_rows, dtype=np.uint64)
    u = (ids * np.uint64(0x9E3779B97F4A7C15)) / np.float64(2**64)
    held = u < fraction
    return np.flatnonzero(~held), np.flatnonzero(held)


def summary(manifest: dict, out: Path) -> str:
    t = manifest["totals"]
    return (
        f"{out}: {t['samples']:,} samples in {t['rows']:,} rows of {manifest['seq_len']} tokens, {t['loss_tokens']:,} "
        "loss tokens, "
        f"packing efficiency {100 * t['packing_efficiency']:.1f}%; overlong ({manifest['overlong']}): "
        f"{t['truncated']} truncated, {t['dropped']} dropped; {t['no_loss']} left out without a loss token (longest "
        "sample "
        f"{t['longest']} tokens)"
    )


def open_prepared(
    cfg: DataConfig,
    seq_len: int,
    tokenizer,
    tokenizer_name: str,
    out: Path,
    rank: int,
    world: int,
    how_to_prepare: str,
    log: Callable[[str], None],
) -> PreparedData:
    """The prepared data for this config: opened if ``out`` holds it; prepared first, over all ``world`` processes, if
    ``out`` holds nothing (each process its share, then polling the file system, never a collective, until the manifest
    is there); refused (DataError) if ``out`` was prepared with other settings or sources."""
    make_format(cfg, tokenizer, tokenizer_name)  # a tokenizer without a chat template is refused first
    expected = describe(cfg, seq_len, tokenizer)
    manifest = read_manifest(out)
    if manifest is None:
        prepare(cfg, seq_len, tokenizer, tokenizer_name, out, rank, world, log=log)
        manifest = wait_until_prepared(out, expected)
    data = PreparedData(out, expected, how_to_prepare)
    log(f"[data] prepared {summary(manifest, out)}")
    return data
