"""Turn records into samples: token ids and, per token, whether the loss counts on predicting it.

``text``: the record's text field followed by EOS; every token but the first is a target.
``chat``: the conversation rendered by the tokenizer's own chat template (``apply_chat_template``);
the targets are what the model generates in each assistant turn: everything after the template's
generation prompt (``<|im_start|>assistant\\n``, plus the empty think block that Qwen3 puts into the
prompt when ``enable_thinking`` is off and the reply brings no reasoning of its own) up to and
including the end-of-turn token that closes the turn (``<|im_end|>``). System, user and tool turns, role headers and
scaffolding are not targets.
Spans follow turns, not text: each assistant turn starts where the template's rendering of the conversation before
it, with the generation prompt, ends (that rendering must be a prefix of the whole). Text of the tokenizer's special
tokens (``<|im_start|>``, ``<|im_end|>``, ...) inside a turn is refused: it would read as the template's own
scaffolding. The generation prompt and the end-of-turn token are read off the template itself, by rendering a
probe conversation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from train.front.data_config import DataConfig
from train.front.data_sources import DataError, Location

ROLES = ("system", "user", "assistant", "tool")
_PROBE_USER, _PROBE_REPLY = "probe question", "probe reply"
BATCH = 256  # records rendered and tokenized together


def _encoder(tokenizer):
    """The fast tokenizer's backend, splitting special tokens as ``tokenizer(...)`` would: called directly on whole
    batches, without the wrapper's per-call conversions (the ids are the same)."""
    backend = tokenizer.backend_tokenizer
    backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
    return backend


def _batches(records: Iterable[tuple[Location, dict]]) -> Iterator[list[tuple[Location, dict]]]:
    batch: list[tuple[Location, dict]] = []
    for item in records:
        batch.append(item)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


@dataclass
class Sample:
    ids: np.ndarray  # int32 token ids
    targets: np.ndarray  # bool: the loss counts on predicting this token from the ones before it


class TextFormat:
    """Documents of ``data.text_field``, each followed by EOS."""

    def __init__(self, cfg: DataConfig, tokenizer):
        self.field, self.eos = cfg.text_field, tokenizer.eos_token_id
        self.encoder = _encoder(tokenizer)

    def samples(self, records: Iterable[tuple[Location, dict]]) -> Iterator[Sample]:
        for batch in _batches(records):
            texts = []
            for where, record in batch:
                text = record.get(self.field)
                if not isinstance(text, str):
                    raise DataError(
                        f"data.text_field: {where} has no string field {self.field!r}; set data.text_field to the key "
                        "holding the text"
                    )
                texts.append(text)
            for enc in self.encoder.encode_batch_fast(texts, add_special_tokens=False):
                ids = np.empty(len(enc.ids) + 1, dtype=np.int32)
                ids[:-1] = enc.ids
                ids[-1] = self.eos
                targets = np.ones(len(ids), dtype=bool)
                targets[0] = False
                yield Sample(ids, targets)


class ChatFormat:
    """Conversations rendered with the tokenizer's chat template; targets on assistant turns only."""

    def __init__(self, cfg: DataConfig, tokenizer, tokenizer_name: str):
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"data.tokenizer: {tokenizer_name} has no chat template (tokenizer_config.json chat_template or "
                "chat_template.jinja); data.format=chat needs one"
            )
        self.field, self.tokenizer, self.thinking = cfg.messages_field, tokenizer, cfg.enable_thinking
        self.encoder = _encoder(tokenizer)
        user = [{"role": "user", "content": _PROBE_USER}]
        bare = self.render(user)
        with_header = self.render(user, add_generation_prompt=True, enable_thinking=True)
        prompt = self.render(user, add_generation_prompt=True)
        replied = self.render(user + [{"role": "assistant", "content": _PROBE_REPLY}])
        tail = replied[len(bare) :]
        if not (with_header.startswith(bare) and prompt.startswith(with_header) and _PROBE_REPLY in tail):
            raise DataError(
                f"data.tokenizer: {tokenizer_name}'s chat template does not render a conversation as its "
                "generation prompt followed by the reply; data.format=chat cannot find the assistant turns"
            )
        self.header = with_header[len(bare) :]  # e.g. "<|im_start|>assistant\n"
        self.prompt_extra = prompt[len(with_header) :]  # e.g. "<think>\n\n</think>\n\n" with enable_thinking off
        end = tail[tail.index(_PROBE_REPLY) + len(_PROBE_REPLY) :]
        end_ids = tokenizer(end, add_special_tokens=False)["input_ids"]
        if not end_ids:
            raise DataError(
                f"data.tokenizer: {tokenizer_name}'s chat template closes an assistant turn with nothing; "
                "data.format=chat needs an end-of-turn token"
            )
        self.end_of_turn = tokenizer.decode(end_ids[:1])  # e.g. "<|im_end|>"
        special = sorted(
            {t.content for t in tokenizer.added_tokens_decoder.values() if t.special} | {self.end_of_turn},
            key=len,
            reverse=True,
        )
        self.special = re.compile("|".join(map(re.escape, special)))

    def render(
        self,
        messages: list,
        tools: list | None = None,
        add_generation_prompt: bool = False,
        enable_thinking: bool | None = None,
    ) -> str | list[str]:
        """A conversation (a list of turns) as text, or a list of conversations as a list of texts."""
        thinking = self.thinking if enable_thinking is None else enable_thinking
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=thinking
        )

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
            raise DataError(
                f"data.messages_field: {where} has no field {self.field!r} (nor prompt and completion); "
                "set data.messages_field to the key holding the list of turns"
            )
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{key}: {where} must be a non-empty list of {{role, content}} turns")
        for i, turn in enumerate(messages):
            if not isinstance(turn, dict) or turn.get("role") not in ROLES:
                role = turn.get("role") if isinstance(turn, dict) else turn
                raise DataError(f"{key}: {where} turn {i} has role {role!r}; allowed: {', '.join(ROLES)}")
            if not isinstance(turn.get("content"), str):
                raise DataError(
                    f"{key}: {where} turn {i} ({turn['role']}) has content of type "
                    f"{type(turn.get('content')).__name__}; content must be a string"
                )
        if not any(turn["role"] == "assistant" for turn in messages):
            raise DataError(f"{key}: {where} has no assistant turn; there is nothing to learn from it")
        tools = record.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise DataError(
                f"tools: {where} must be a list of tool descriptions (JSON objects), not {type(tools).__name__}"
            )
        for i, turn in enumerate(messages):
            self._refuse_special_text(key, where, i, turn)
        return messages

    def _refuse_special_text(self, key: str, where: Location, i: int, turn: dict) -> None:
        """Refuse a turn any of whose strings (content, reasoning, tool calls) holds a special token's text."""
        stack = [(name, value) for name, value in turn.items() if name != "role"]
        while stack:
            name, value = stack.pop()
            if isinstance(value, str):
                found = self.special.search(value)
                if found:
                    raise DataError(
                        f"{key}: {where} turn {i} ({turn['role']}) {name} holds the special token text "
                        f"{found.group()!r}; "
                        "special tokens may not appear inside a turn (they are the chat template's own markers)"
                    )
            elif isinstance(value, dict):
                stack += [(f"{name}.{k}", v) for k, v in value.items()]
            elif isinstance(value, list):
                stack += [(f"{name}[{j}]", v) for j, v in enumerate(value)]

    def spans(self, text: str, prompts: list[str], where: Location) -> list[tuple[int, int]]:
        """Character spans [start, end) of the targets: each assistant turn from the end of its prompt (the conversation
        before it, rendered with the generation prompt; or without the generation prompt's empty think block, when the
        reply brings its own reasoning or the template leaves it out of earlier turns) through its end-of-turn token."""
        out, cursor = [], 0
        extra = self.prompt_extra
        for k, prompt in enumerate(prompts):
            if text.startswith(prompt):
                start = len(prompt)
            elif extra and prompt.endswith(extra) and text.startswith(prompt[: -len(extra)]):
                start = len(prompt) - len(extra)
            else:
                start = -1
            if start < cursor:
                raise DataError(
                    f"data.format=chat: {where}: the chat template renders the conversation before assistant turn "
                    f"{k + 1} otherwise when later turns follow; its targets cannot be found turn by turn"
                )
            end = text.find(self.end_of_turn, start)
            if end < 0:
                raise DataError(f"data.format=chat: {where}: an assistant turn is not closed by {self.end_of_turn!r}")
            cursor = end + len(self.end_of_turn)
            out.append((start, cursor))
        return out

    def _prompts(self, conversations: list[list[dict]], tools: list | None) -> list[list[str]]:
        """Per conversation, per assistant turn: the conversation before that turn rendered with the generation prompt
        (for a conversation that opens with the assistant, the generation prompt alone)."""
        befores = [
            conv[:k] for conv in conversations for k, turn in enumerate(conv) if turn["role"] == "assistant" and k
        ]
        rendered = iter(self.render(befores, tools=tools, add_generation_prompt=True) if befores else ())
        opening = self.header + self.prompt_extra
        return [
            [next(rendered) if k else opening for k, turn in enumerate(conv) if turn["role"] == "assistant"]
            for conv in conversations
        ]

    def sample(self, where: Location, record: dict) -> Sample:
        return next(self.samples([(where, record)]))

    def samples(self, records: Iterable[tuple[Location, dict]]) -> Iterator[Sample]:
        for batch in _batches(records):
            conversations = [self.messages(where, record) for where, record in batch]
            texts: list[str] = []
            prompts: list[list[str]] = []
            at = 0
            while at < len(batch):  # consecutive records with the same tools are rendered in one call
                tools = batch[at][1].get("tools")
                end = at + 1
                while end < len(batch) and batch[end][1].get("tools") == tools:
                    end += 1
                texts += self.render(conversations[at:end], tools=tools)
                prompts += self._prompts(conversations[at:end], tools)
                at = end
            for (where, _), turn_prompts, text, enc in zip(
                batch, prompts, texts, self.encoder.encode_batch(texts, add_special_tokens=False), strict=False
            ):
                spans = self.spans(text, turn_prompts, where)
                ids = np.asarray(enc.ids, dtype=np.int32)
                starts = np.fromiter((s for s, _ in enc.offsets), dtype=np.int64, count=len(ids))
                bounds = np.asarray(spans, dtype=np.int64).reshape(-1)  # s0, e0, s1, e1, ...: sorted, disjoint
                targets = np.searchsorted(bounds, starts, side="right") % 2 == 1  # inside some [s, e)
                yield Sample(ids, targets)


def make_format(cfg: DataConfig, tokenizer, tokenizer_name: str) -> TextFormat | ChatFormat:
    return ChatFormat(cfg, tokenizer, tokenizer_name) if cfg.format == "chat" else TextFormat(cfg, tokenizer)
