"""Turn records into samples: token ids and, per token, whether the loss counts on predicting it.

``text``: the record's text field followed by EOS; every token but the first is a target.
``chat``: the conversation rendered by the tokenizer's own chat template (``apply_chat_template``);
the targets are what the model generates in each assistant turn: everything after the template's
generation prompt (``<|im_start|>assistant\\n``, plus the empty think block that Qwen3 puts into the
prompt when ``enable_thinking`` is off and the reply brings no reasoning of its own) up to and
including the end-of-turn token that closes the turn (``<|im_end|>``). System, user and tool turns, role headers and scaffolding are not targets.
The generation prompt and the end-of-turn token are read off the template itself, by rendering a
probe conversation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from train.data.config import DataConfig
from train.data.sources import DataError, Location

ROLES = ("system", "user", "assistant", "tool")
_PROBE_USER, _PROBE_REPLY = "probe question", "probe reply"


@dataclass
class Sample:
    ids: np.ndarray  # int32 token ids
    targets: np.ndarray  # bool: the loss counts on predicting this token from the ones before it


class TextFormat:
    """Documents of ``data.text_field``, each followed by EOS."""

    def __init__(self, cfg: DataConfig, tokenizer):
        self.field, self.tokenizer, self.eos = cfg.text_field, tokenizer, tokenizer.eos_token_id

    def samples(self, records: Iterable[tuple[Location, dict]], batch: int = 256) -> Iterator[Sample]:
        texts: list[str] = []

        def flush() -> Iterator[Sample]:
            ids = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
            for doc in ids:
                arr = np.asarray(doc + [self.eos], dtype=np.int32)
                targets = np.ones(len(arr), dtype=bool)
                targets[0] = False
                yield Sample(arr, targets)
            texts.clear()

        for where, record in records:
            text = record.get(self.field)
            if not isinstance(text, str):
                raise DataError(f"data.text_field: {where} has no string field {self.field!r}; set data.text_field to the key holding the text")
            texts.append(text)
            if len(texts) == batch:
                yield from flush()
        if texts:
            yield from flush()


class ChatFormat:
    """Conversations rendered with the tokenizer's chat template; targets on assistant turns only."""

    def __init__(self, cfg: DataConfig, tokenizer, tokenizer_name: str):
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(f"data.tokenizer: {tokenizer_name} has no chat template (tokenizer_config.json chat_template or "
                            "chat_template.jinja); data.format=chat needs one")
        self.field, self.tokenizer, self.thinking = cfg.messages_field, tokenizer, cfg.enable_thinking
        user = [{"role": "user", "content": _PROBE_USER}]
        bare = self.render(user)
        with_header = self.render(user, add_generation_prompt=True, enable_thinking=True)
        prompt = self.render(user, add_generation_prompt=True)
        replied = self.render(user + [{"role": "assistant", "content": _PROBE_REPLY}])
        tail = replied[len(bare):]
        if not (with_header.startswith(bare) and prompt.startswith(with_header) and _PROBE_REPLY in tail):
            raise DataError(f"data.tokenizer: {tokenizer_name}'s chat template does not render a conversation as its "
                            "generation prompt followed by the reply; data.format=chat cannot find the assistant turns")
        self.header = with_header[len(bare):]  # e.g. "<|im_start|>assistant\n"
        self.prompt_extra = prompt[len(with_header):]  # e.g. "<think>\n\n</think>\n\n" with enable_thinking off
        end = tail[tail.index(_PROBE_REPLY) + len(_PROBE_REPLY):]
        end_ids = tokenizer(end, add_special_tokens=False)["input_ids"]
        if not end_ids:
            raise DataError(f"data.tokenizer: {tokenizer_name}'s chat template closes an assistant turn with nothing; "
                            "data.format=chat needs an end-of-turn token")
        self.end_of_turn = tokenizer.decode(end_ids[:1])  # e.g. "<|im_end|>"

    def render(self, messages: list[dict], tools: list | None = None, add_generation_prompt: bool = False,
               enable_thinking: bool | None = None) -> str:
        thinking = self.thinking if enable_thinking is None else enable_thinking
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  enable_thinking=thinking)

    def messages(self, where: Location, record: dict) -> list[dict]:
        """The record's turns (``messages_field``, or ``prompt`` + ``completion``), checked."""
        if self.field in record:
            messages = record[self.field]
            key = f"data.messages_field ({self.field})"
        elif "prompt" in record and "completion" in record:
            prompt, completion = record["prompt"], record["completion"]
            key = "prompt/completion"
            if isinstance(prompt, str) and isinstance(completion, str):
                messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            elif isinstance(prompt, list) and isinstance(completion, list):
                messages = prompt + completion
            else:
                raise DataError(f"{key}: {where}: prompt and completion must both be strings or both lists of turns")
        else:
            raise DataError(f"data.messages_field: {where} has no field {self.field!r} (nor prompt and completion); "
                            "set data.messages_field to the key holding the list of turns")
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{key}: {where} must be a non-empty list of {{role, content}} turns")
        for i, turn in enumerate(messages):
            if not isinstance(turn, dict) or turn.get("role") not in ROLES:
                role = turn.get("role") if isinstance(turn, dict) else turn
                raise DataError(f"{key}: {where} turn {i} has role {role!r}; allowed: {', '.join(ROLES)}")
            if not isinstance(turn.get("content"), str):
                raise DataError(f"{key}: {where} turn {i} ({turn['role']}) has content of type "
                                f"{type(turn.get('content')).__name__}; content must be a string")
        if not any(turn["role"] == "assistant" for turn in messages):
            raise DataError(f"{key}: {where} has no assistant turn; there is nothing to learn from it")
        return messages

    def spans(self, text: str, assistant_turns: int, where: Location) -> list[tuple[int, int]]:
        """Character spans [start, end) of the targets: each assistant turn after its generation prompt, through the end-of-turn token."""
        out, cursor = [], 0
        for _ in range(assistant_turns):
            start = text.find(self.header, cursor)
            if start < 0:
                raise DataError(f"data.format=chat: {where}: the chat template rendered fewer assistant headers "
                                f"({self.header!r}) than the conversation has assistant turns")
            start += len(self.header)
            if self.prompt_extra and text.startswith(self.prompt_extra, start):
                start += len(self.prompt_extra)
            end = text.find(self.end_of_turn, start)
            if end < 0:
                raise DataError(f"data.format=chat: {where}: an assistant turn is not closed by {self.end_of_turn!r}")
            cursor = end + len(self.end_of_turn)
            out.append((start, cursor))
        return out

    def sample(self, where: Location, record: dict) -> Sample:
        messages = self.messages(where, record)
        text = self.render(messages, tools=record.get("tools"))
        spans = self.spans(text, sum(turn["role"] == "assistant" for turn in messages), where)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
        targets = np.zeros(len(ids), dtype=bool)
        for s, e in spans:
            targets |= (starts >= s) & (starts < e)
        return Sample(ids, targets)

    def samples(self, records: Iterable[tuple[Location, dict]]) -> Iterator[Sample]:
        for where, record in records:
            yield self.sample(where, record)


def make_format(cfg: DataConfig, tokenizer, tokenizer_name: str) -> TextFormat | ChatFormat:
    return ChatFormat(cfg, tokenizer, tokenizer_name) if cfg.format == "chat" else TextFormat(cfg, tokenizer)
