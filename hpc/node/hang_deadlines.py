"""When a rank's heartbeat (`hpc.node.heartbeat`) says it hangs: each phase has its own deadline, following what the
rank measured (`deadline`; the docs' table is `markdown_table`), and the restart supervisor names a silent rank with
its node in seconds.

A rank is hung when its heartbeat thread stopped (``alive`` older than ``FROZEN_S``: the process stopped, stuck
holding the GIL, or gone with its node): it is named with its node. Ranks alive but past their phase's deadline
(`late`) are said, not named: when one rank hangs in a kernel or a collective its peers wait in theirs, alive and late
too, at the same or the next step, so the beats cannot tell which one it is; the collective timeout
(`hpc.node.hang`) names who is missing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hpc.node.heartbeat import EVAL, SAVE, STEP

FROZEN_S = 10.0  # a heartbeat thread silent this long: its process does not run
FIRST_STEP_S = 600.0
STEP_MIN_S = 10.0
STEP_FACTOR = 5.0
STEP_UNMEASURED_S = 60.0
SAVE_MIN_S = 180.0
EVAL_MIN_S = 120.0
LONGER_FACTOR = 3.0


def deadline(beat: dict) -> float:
    """Seconds ``beat``'s rank may stay in its phase."""
    phase = beat.get("phase")
    if phase == STEP:
        times = beat.get("step_s") or []
        return max(STEP_MIN_S, STEP_FACTOR * statistics.median(times)) if times else STEP_UNMEASURED_S
    if phase == SAVE:
        return max(SAVE_MIN_S, LONGER_FACTOR * float(beat.get("save_s") or 0))
    if phase == EVAL:
        return max(EVAL_MIN_S, LONGER_FACTOR * float(beat.get("eval_s") or 0))
    return FIRST_STEP_S


@dataclass(frozen=True)
class Silent:
    """A hung rank: where, in what phase, silent since when, and the bound it passed."""

    rank: int
    node: str
    phase: str
    step: object
    since: float
    bound_s: float
    frozen: bool

    def line(self, now: float) -> str:
        what = "its process stopped running" if self.frozen else f"past its {self.phase} deadline"
        return (
            f"rank {self.rank} on {self.node} silent {now - self.since:.0f} s in its {self.phase} (step {self.step}): "
            f"{what} ({self.bound_s:.0f} s)"
        )


def hung(beats: list[dict], ended: set[int], now: float) -> list[Silent]:
    """The hung ranks among ``beats``, their heartbeat threads stopped (ranks in ``ended`` left an exit record: the
    records judge them), at ``now``."""
    return [
        Silent(b["rank"], b["node"], b["phase"], b.get("step"), b["alive"], FROZEN_S, True)
        for b in beats
        if b.get("rank") not in ended and now - b["alive"] > FROZEN_S
    ]


def late(beats: list[dict], ended: set[int], now: float) -> list[Silent]:
    """The ranks alive but past their phase's deadline at ``now``."""
    return [
        Silent(b["rank"], b["node"], b["phase"], b.get("step"), b["since"], deadline(b), False)
        for b in beats
        if b.get("rank") not in ended and now - b["since"] > deadline(b)
    ]


def markdown_table() -> str:
    """The phases' deadlines as the docs show them."""
    return (
        "| phase | deadline |\n"
        "| --- | --- |\n"
        f"| any: its heartbeat thread stopped (the process stopped, holding the GIL, or gone): named, a hang | "
        f"{FROZEN_S:g} s |\n"
        f"| first step of a start (compilation, the first collectives) | {FIRST_STEP_S:g} s |\n"
        f"| step | max({STEP_MIN_S:g} s, {STEP_FACTOR:g} x the median of its recent step times); "
        f"{STEP_UNMEASURED_S:g} s before one is measured |\n"
        f"| checkpoint save | max({SAVE_MIN_S:g} s, {LONGER_FACTOR:g} x its longest save in this start) |\n"
        f"| evaluation | max({EVAL_MIN_S:g} s, {LONGER_FACTOR:g} x its longest evaluation) |\n"
    )
