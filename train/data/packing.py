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


# Preparation refuses data of which more than this share of samples has no loss token within seq_len.
MAX_NO_LOSS_SHARE = 0.5


@dataclass
class PackStats:
    samples: int = 0  # packed (after dropping)
    rows: int = 0
    tokens: int = 0  # sample tokens, excluding padding
    loss_tokens: int = 0
    truncated: int = 0
    dropped: int = 0  # longer than seq_len, with overlong=drop
    no_loss: int = 0  # left out: no loss token (left) within seq_len
    longest: int = 0  # tokens of the longest sample, before truncation

    def add(self, other: PackStats) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, max(self.longest, value) if key == "longest" else getattr(self, key) + value)

    def efficiency(self, seq_len: int) -> float:
        """Share of row tokens that are sample tokens (not padding)."""
        return self.tokens / max(1, self.rows * seq_len)

    def no_loss_refusal(self, seq_len: int, overlong: str) -> str | None:
        """The one-line refusal of data of which more than ``MAX_NO_LOSS_SHARE`` of the samples (or all) have no loss
        token within seq_len, else None."""
        seen = self.samples + self.dropped + self.no_loss
        if self.no_loss <= MAX_NO_LOSS_SHARE * seen and self.samples:
            return None
        return (
            f"data.overlong={overlong}: {self.no_loss} of {seen} samples have no loss token within seq_len={seq_len} "
            f"(the longest sample has {self.longest} tokens), more than {MAX_NO_LOSS_SHARE:.0%} or all; raise seq_len, "
            "or set data.overlong=truncate_left (keeps each sample's end: the last replies) or drop"
        )


def pack(
    samples: Iterable[Sample], seq_len: int, overlong: str, pad_id: int
) -> tuple[np.ndarray, np.ndarray, PackStats]:
    """Rows ([rows, seq_len] tokens and flags) holding every sample whole; longer ones cut to their first seq_len tokens
    (``overlong`` truncate), their last (truncate_left) or left out (drop). A sample without a loss token (after the
    cut; a sample's first token never is one) is left out and counted (``no_loss``)."""
    stats = PackStats()
    kept: list[Sample] = []
    for s in samples:
        stats.longest = max(stats.longest, len(s.ids))
        if len(s.ids) > seq_len:
            if overlong == "drop":
                stats.dropped += 1
                continue
            cut = slice(-seq_len, None) if overlong == "truncate_left" else slice(seq_len)
            s = Sample(s.ids[cut], s.targets[cut])
            stats.truncated += 1
        if not s.targets[1:].any():
            stats.no_loss += 1
            continue
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
