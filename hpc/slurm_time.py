"""Slurm time strings (``--time``, partition ``MaxTime``) to minutes."""

from __future__ import annotations

import re
from typing import Optional

from hpc.node.cli import shown

_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"


def parse_minutes(text: str) -> Optional[int]:
    """Minutes in a Slurm time string (seconds round up); None for UNLIMITED/INFINITE."""
    t = str(text)
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = re.fullmatch(r"(?:([0-9]{1,7})-)?([0-9]{1,9})(?::([0-9]{1,9}))?(?::([0-9]{1,9}))?", t)
    if not m:
        raise ValueError(f"time {shown(text)} is not a Slurm time; allowed forms: {_FORMS}")
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b) if b else None, int(c) if c else None
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = a * 3600 + b * 60 + c
    elif b is not None:  # MM:SS
        seconds = a * 60 + b
    else:  # MM
        seconds = a * 60
    if seconds <= 0:
        raise ValueError(f"time {shown(text)} must be longer than zero")
    return -(-seconds // 60)


def format_minutes(minutes: int) -> str:
    """Minutes as Slurm's D-HH:MM:SS (or HH:MM:SS under a day)."""
    d, rem = divmod(minutes, 1440)
    h, m = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:00" if d else f"{h:02d}:{m:02d}:00"
