"""How one optimizer step's global batch splits over the data-parallel ranks, torch-free (the trainer, the submit
check and the planner share it).

The global batch (``global_batch`` rows of ``seq_len`` tokens) is what is trained and never changes with the layout:
dp rank ``r`` takes the ``r``-th contiguous share of the step's rows (shares differ by at most one row when dp does
not divide the global batch), in ``accum`` micro-batches of at most ``micro_batch`` rows, the same ``accum`` on every
rank. A rank whose share is shorter than ``accum`` runs the rest as padding micro-batches that count no loss token:
the loss is the mean over the whole global batch's loss tokens, so the trained step is the same at every dp."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchSplit:
    global_batch: int
    micro_batch: int
    dp: int

    @property
    def accum(self) -> int:
        """Micro-batches per rank per step: enough for the largest share at micro_batch rows each."""
        return max(1, math.ceil(math.ceil(self.global_batch / self.dp) / self.micro_batch))

    def share(self, dp_rank: int) -> tuple[int, int]:
        """(first row in the step's global batch, rows) of dp rank ``dp_rank``."""
        base, extra = divmod(self.global_batch, self.dp)
        return dp_rank * base + min(dp_rank, extra), base + (dp_rank < extra)

    @property
    def real_micro_batches(self) -> int:
        """Micro-batches over all dp ranks that hold rows (the others are padding)."""
        return sum(min(self.share(r)[1], self.accum) for r in range(self.dp))

    @property
    def idle_ranks(self) -> int:
        """dp ranks that take no row (a global batch smaller than dp)."""
        return max(0, self.dp - self.global_batch)

    @property
    def even(self) -> bool:
        """Whether every dp rank takes as many rows."""
        return self.global_batch % self.dp == 0

    def even_global_batches(self) -> list[int]:
        """The global batches nearest to this one (below and above) that split evenly over dp."""
        below = self.global_batch // self.dp * self.dp
        return ([below] if below else []) + [below + self.dp]

    def describe(self) -> str:
        """The split in words, for the trainer's layout line and the planner."""
        rows = {self.share(r)[1] for r in range(self.dp)}
        most = math.ceil(max(rows) / self.accum)
        return (
            f"global_batch {self.global_batch} = dp {self.dp} x {'-'.join(map(str, sorted(rows)))} rows, "
            f"grad accumulation {self.accum} x micro-batches of at most {most} rows"
        )

    def uneven_note(self) -> str | None:
        """One line when the global batch does not split evenly (the same training, some ranks wait or idle), naming
        the nearest global batches that do; None when it splits evenly."""
        if self.even:
            return None
        options = " or ".join(str(g) for g in self.even_global_batches())
        if self.idle_ranks:
            what = f"{self.idle_ranks} of the dp={self.dp} ranks take no rows (their GPUs idle)"
        else:
            low = self.global_batch // self.dp
            what = f"the dp={self.dp} ranks take {low} or {low + 1} rows"
        return (
            f"global_batch={self.global_batch} does not split evenly over dp={self.dp}: {what}; the same batch is "
            f"trained, a step waits for the fullest rank; global_batch {options} splits evenly "
            "(python -m hpc.plan --global-batch N shows a split)"
        )
