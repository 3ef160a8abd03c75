"""Pack samples into rows of ``seq_len`` tokens without crossing a sample, and turn rows into model inputs.

A row is ``tokens`` (int32) and ``flags`` (uint8): ``START`` marks the first token of a sample (and of the
padding that fills the row's end), ``TARGET`` a token whose prediction counts in the loss. Samples are
placed best-fit decreasing (longest first, each into the fullest row it fits in), which fills rows far
better than first-come order. Position ids restart at every ``START``; a label is the next token of
the same row where that token is a ``TARGET`` (never the first token of a sample), else -100.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from train.data.formats import Sample

START, TARGET = 1, 2
IGNORE = -100


@dataclass
class PackStats:
    samples: int = 0  # packed (after dropping)
    rows: int = 0
    tokens: int = 0  # sample tokens, excluding padding
    loss_tokens: int = 0
    truncated: int = 0
    dropped: int = 0

    def add(self, other: PackStats) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)

    def efficiency(self, seq_len: int) -> float:
        """Share of row tokens that are sample tokens (not padding)."""
        return self.tokens / max(1, self.rows * seq_len)


def pack(samples: Iterable[Sample], seq_len: int, overlong: str, pad_id: int) -> tuple[np.ndarray, np.ndarray, PackStats]:
    """Rows ([rows, seq_len] tokens and flags) holding every sample whole; longer ones truncated or dropped (``overlong``)."""
    stats = PackStats()
    kept: list[Sample] = []
    for s in samples:
        if len(s.ids) > seq_len:
            if overlong == "drop":
                stats.dropped += 1
                continue
            s = Sample(s.ids[:seq_len], s.targets[:seq_len])
            stats.truncated += 1
        if len(s.ids):
            kept.append(s)
    order = sorted(range(len(kept)), key=lambda i: (-len(kept[i].ids), i))
    free: list[tuple[int, int]] = []  # (free tokens, row), sorted
    rows: list[list[int]] = []
    for i in order:
        n = len(kept[i].ids)
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            room, row = free.pop(at)
        else:
            room, row = seq_len, len(rows)
            rows.append([])
        rows[row].append(i)
        if room - n:
            bisect.insort(free, (room - n, row))
    tokens = np.full((len(rows), seq_len), pad_id, dtype=np.int32)
    flags = np.zeros((len(rows), seq_len), dtype=np.uint8)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            s = kept[i]
            n = len(s.ids)
            tokens[r, at : at + n] = s.ids
            flags[r, at : at + n] = np.where(s.targets, TARGET, 0)
            flags[r, at] = START
            at += n
        if at < seq_len:
            flags[r, at] = START  # padding is a segment of its own, with no targets
    stats.samples, stats.rows = len(kept), len(rows)
    stats.tokens = sum(len(s.ids) for s in kept)
    stats.loss_tokens = int(((flags & TARGET) > 0).sum())
    return tokens, flags, stats


def model_inputs(tokens: np.ndarray, flags: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, labels, position_ids), int64 [rows, seq_len], of packed rows."""
    tokens64 = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    f = torch.from_numpy(np.asarray(flags))
    labels = torch.full_like(tokens64, IGNORE)
    target = (f[:, 1:] & TARGET) > 0
    labels[:, :-1] = torch.where(target, tokens64[:, 1:], IGNORE)
    idx = torch.arange(tokens64.shape[1]).expand_as(tokens64)
    starts = torch.where((f & START) > 0, idx, 0)
    position_ids = idx - torch.cummax(starts, dim=1).values
    return tokens64, labels, position_ids
