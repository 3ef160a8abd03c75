"""Data preparation's shared pieces: the chat source's size, its config, a prepared directory's bytes, long chats.
(The `tok` and `source` fixtures are in conftest.py.)"""

from __future__ import annotations

import json
from pathlib import Path

SEQ = 64
LINES = 600  # about 150 kB of the demo chat data: 10 chunks of 16 kB


def cfg(path: Path, **kw):
    """The chat DataConfig of ``path`` in 16 kB chunks."""
    from train.front.data_config import DataConfig

    return DataConfig(format="chat", path=str(path), chunk_bytes=16384, **kw)


def tree(out: Path) -> dict[str, bytes]:
    """A prepared directory's files and their bytes."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def long_prompt_chats(path: Path, n: int) -> Path:
    """A system line, a user turn far longer than seq_len, a short answer; ``n`` such chats."""
    long_user = " ".join(f"Line {i} of a long speech, spoken slowly." for i in range(20))
    path.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "system", "content": "You answer questions about Shakespeare."},
                        {"role": "user", "content": f"{long_user} Question {i}: who speaks?"},
                        {"role": "assistant", "content": f"Hamlet {i}."},
                    ]
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return path
