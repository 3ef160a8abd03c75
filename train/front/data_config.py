"""The ``data`` section of the training config: where samples come from and how they become rows."""

from __future__ import annotations

from typing import Literal

import pydantic

CHUNK_BYTES = 16 * 2**20


class DataConfig(pydantic.BaseModel, extra="forbid", strict=True, allow_inf_nan=False):
    """Where the training data comes from and how it is tokenized.

    path: a JSONL file (one JSON object per line), a plain ``.txt`` file (the whole file is one
    document, text format only), or a directory written by ``datasets.Dataset.save_to_disk``
    (needs the ``datasets`` package; a DatasetDict uses its ``train`` split). None = the shipped
    demo corpus (16 Shakespeare works) for ``format: text``, the shipped demo chat set for ``chat``.
    format: ``text`` reads ``text_field``; ``chat`` reads ``messages_field`` (a list of
    ``{role, content}`` turns, or a record with ``prompt`` and ``completion``), renders it with the
    tokenizer's chat template and counts the loss on assistant tokens only.
    pack: ``documents`` packs whole samples into rows of seq_len (position ids restart and attention
    stops at each sample); ``stream`` (text only) cuts the concatenated corpus into blocks that run
    across documents. None = ``stream`` for text, ``documents`` for chat.
    overlong: a sample longer than seq_len is cut to its first seq_len tokens (truncate), to its last seq_len tokens
    (truncate_left: keeps the end of a conversation, its last replies, and cuts the prompt from the left) or left out
    (drop). A sample left with no loss token within seq_len is left out and counted; preparation refuses data of
    which more than half the samples (or all) are left without one.
    prepared: the directory of the prepared (tokenized, packed) data; None = ``<log.dir>/data``.
    chunk_bytes: the unit of work of ``train.prepare`` (a byte range of the source); part of the manifest.
    tokenizer: a Hugging Face tokenizer directory; None = model.path's tokenizer, else the shipped demo
    tokenizer (for chat: its variant with Qwen3's chat tokens and a Qwen3-style chat template).
    """

    path: str | None = None
    format: Literal["text", "chat"] = "text"
    text_field: str = "text"
    messages_field: str = "messages"
    enable_thinking: bool = False
    pack: Literal["stream", "documents"] | None = None
    overlong: Literal["truncate", "truncate_left", "drop"] = "truncate"
    prepared: str | None = None
    chunk_bytes: int = pydantic.Field(CHUNK_BYTES, ge=1024)
    tokenizer: str | None = None

    @pydantic.model_validator(mode="after")
    def _chat_packs_documents(self) -> DataConfig:
        if self.format == "chat" and self.pack == "stream":
            raise ValueError(
                "data.pack=stream: chat data is packed by conversation; use data.pack=documents or leave it unset"
            )
        return self

    @property
    def packed(self) -> bool:
        """Whether samples are packed by document into prepared rows (chat always is)."""
        return self.pack == "documents" or (self.pack is None and self.format == "chat")
