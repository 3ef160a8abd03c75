"""Deterministic, resumable streams of training rows for one data-parallel rank.

``TokenStream`` cuts one token tensor into blocks that run across documents; ``PackedStream``
serves rows of a prepared dataset (packed by document). Both yield micro-batches of
(input_ids, labels[, position_ids]).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from train.data.packing import IGNORE, model_inputs
from train.front.batch_split import BatchSplit
from train.front.data_sources import DataError


def _epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class TokenStream:
    """Deterministic, resumable stream of blocks for one data-parallel rank.

    The tokens are cut into ``num_blocks`` blocks of ``seq_len + 1`` tokens (tail
    dropped); a subclass may serve other rows through ``_rows``. Each epoch visits the
    blocks in a permutation fixed by (seed, epoch); every
    global step takes the next ``global_batch`` blocks of it, and an epoch ends when fewer
    than ``global_batch`` blocks remain. Rank ``r`` gets the ``r``-th contiguous share of them
    as ``BatchSplit`` deals them (any dp_size), padded to the same number of micro-batches on every
    rank with rows that count no loss token (``last_padding`` of them, last). The state
    (epoch, samples consumed in the epoch) does not depend on dp_size or micro_batch, so
    a run may resume under another layout without repeating or skipping samples.
    ``last_sample_ids`` lists the global block ids this rank took in the last step.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        seq_len: int,
        global_batch: int,
        micro_batch: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
    ):
        if tokens.dim() != 1:
            raise DataError(f"tokens must be a 1-D tensor, got shape {tuple(tokens.shape)}")
        if min(seq_len, global_batch, micro_batch, dp_size) < 1:
            raise DataError(
                f"seq_len, global_batch, micro_batch and dp_size must be >= 1, "
                f"got {seq_len}, {global_batch}, {micro_batch}, {dp_size}"
            )
        if not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
        self.num_blocks = tokens.numel() // (seq_len + 1)
        if self.num_blocks < global_batch:
            raise DataError(
                f"corpus too small: {tokens.numel()} tokens make {self.num_blocks} blocks of seq_len+1={seq_len + 1}, "
                f"fewer than global_batch={global_batch}; use more data or a smaller seq_len/global_batch"
            )
        self.blocks = tokens[: self.num_blocks * (seq_len + 1)].view(self.num_blocks, seq_len + 1)
        self._init_order(seq_len, global_batch, micro_batch, dp_rank, dp_size, seed)

    def _init_order(
        self, seq_len: int, global_batch: int, micro_batch: int, dp_rank: int, dp_size: int, seed: int
    ) -> None:
        self.seq_len, self.global_batch, self.micro_batch = seq_len, global_batch, micro_batch
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.split = BatchSplit(global_batch, micro_batch, dp_size)
        self.last_padding = 0
        self.steps_per_epoch = self.num_blocks // global_batch
        self.epoch, self.consumed = 0, 0
        self.last_sample_ids: list[int] = []
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.int64)

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.epoch:
            gen = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
            self._perm, self._perm_epoch = torch.randperm(self.num_blocks, generator=gen), self.epoch
        return self._perm

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        block = self.blocks[ids].long()
        return block[:, :-1].contiguous(), block[:, 1:].contiguous()

    def next_microbatches(self) -> list[tuple[torch.Tensor, ...]]:
        """This rank's micro-batches for the next global step: (input_ids, labels), or with position_ids for packed
        rows."""
        if self.consumed + self.global_batch > self.num_blocks:
            self.epoch, self.consumed = self.epoch + 1, 0
        step = self._permutation()[self.consumed : self.consumed + self.global_batch]
        start, rows = self.split.share(self.dp_rank)
        ids = step[start : start + rows]
        self.consumed += self.global_batch
        self.last_sample_ids = ids.tolist()
        micro = [self._rows(mb) for mb in ids.tensor_split(self.split.accum) if len(mb)]
        self.last_padding = self.split.accum - len(micro)
        if self.last_padding:  # a row of the step with no loss token, so that every rank runs as many passes
            row = self._rows(step[:1])
            micro += [(row[0], torch.full_like(row[1], IGNORE), *row[2:])] * self.last_padding
        return micro

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
                raise DataError(
                    f"data state {key}={d[key]} does not match this stream's {key}={getattr(self, key)}; "
                    "resume with the same data, seq_len and seed"
                )
        if not 0 <= d["consumed"] <= self.num_blocks:
            raise DataError(f"data state consumed={d['consumed']} must be in [0, num_blocks={self.num_blocks}]")
        self.epoch, self.consumed = int(d["epoch"]), int(d["consumed"])


class PackedStream(TokenStream):
    """The same order and state over ``row_ids`` of a prepared dataset (rows packed by document).

    Micro-batches are (input_ids, labels, position_ids); labels are -100 where the loss does not count."""

    def __init__(
        self, data, row_ids: np.ndarray, global_batch: int, micro_batch: int, dp_rank: int, dp_size: int, seed: int
    ):
        self.data, self.row_ids = data, row_ids
        self.num_blocks = len(row_ids)
        if self.num_blocks < global_batch:
            raise DataError(
                f"data too small: {self.num_blocks} packed rows of seq_len={data.seq_len}, fewer than "
                f"global_batch={global_batch}; use more data or a smaller seq_len/global_batch"
            )
        self._init_order(data.seq_len, global_batch, micro_batch, dp_rank, dp_size, seed)

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return model_inputs(*self.data.rows(self.row_ids[ids.numpy()]))


def eval_batches(
    data, row_ids: np.ndarray, rows: int, micro_batch: int, dp_rank: int, dp_size: int
) -> list[tuple[torch.Tensor, ...]]:
    """This rank's micro-batches of the first ``rows`` of ``row_ids`` (fewer if there are fewer; a multiple of
    micro_batch x dp_size, so every rank runs as many), each rank its contiguous share; fixed for the whole run."""
    unit = micro_batch * dp_size
    n = min(rows, len(row_ids)) // unit * unit
    if n == 0:
        raise DataError(
            f"eval: {len(row_ids)} held-out rows, fewer than micro_batch x dp = {unit}; "
            "raise eval.fraction or give a larger eval.path"
        )
    share = n // dp_size
    mine = row_ids[dp_rank * share : (dp_rank + 1) * share]
    return [model_inputs(*data.rows(mine[i : i + micro_batch])) for i in range(0, share, micro_batch)]
