"""Chat data: rendering with the tokenizer's own template and the assistant-only targets, proven token by token
against an independent computation (each assistant turn's targets = what the template renders after the
conversation's prefix with its generation prompt, up to the end-of-turn token)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from train.data.formats import ChatFormat
from train.data.tokenizer import load_tokenizer
from train.front.data_config import DataConfig
from train.front.data_sources import DataError, Location
from train.front.tokenizer import DEMO_CHAT_TOKENIZER_DIR

WHERE = Location(Path("conversations.jsonl"), 0)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find_line",
            "description": "Find a line in a play",
            "parameters": {"type": "object", "properties": {"play": {"type": "string"}}},
        },
    }
]
CONVERSATIONS = [
    [{"role": "user", "content": "Who is Hamlet?"}, {"role": "assistant", "content": "A prince of Denmark."}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a tragedy."},
        {"role": "assistant", "content": "Macbeth."},
        {"role": "user", "content": "And a comedy?"},
        {"role": "assistant", "content": "Twelfth Night, or What You Will."},
    ],
    [
        {"role": "user", "content": "Think first: who wrote the Sonnets?"},
        {"role": "assistant", "content": "<think>\nThe title says it.\n</think>\n\nShakespeare."},
    ],
    [
        {"role": "user", "content": "Find the first line of Macbeth."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "find_line", "arguments": {"play": "Macbeth"}}}],
        },
        {"role": "tool", "content": "When shall we three meet again"},
        {"role": "assistant", "content": "It is: When shall we three meet again."},
    ],
]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(DEMO_CHAT_TOKENIZER_DIR))


def chat(tok, thinking=False, template=None):
    if template is not None:
        tok.chat_template = template
    return ChatFormat(DataConfig(format="chat", enable_thinking=thinking), tok, "demo chat tokenizer")


def tools_of(messages):
    return TOOLS if any("tool_calls" in m for m in messages) else None


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def last_turn_by_prefix(tok, messages, thinking):
    """Independent: ids and targets of a conversation ending in an assistant turn, from two renders: the conversation
    before that turn with the generation prompt (no targets), then the rest: the reply up to and including <|im_end|>
    (targets) and what the template adds after it (none). A reply that brings its own reasoning follows the prompt
    without the empty think block (the thinking-on prompt), also when thinking is off."""
    tools = tools_of(messages)
    full = tok.apply_chat_template(messages, tools=tools, tokenize=False, enable_thinking=thinking)
    prompt = tok.apply_chat_template(
        messages[:-1], tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    if not full.startswith(prompt):
        prompt = tok.apply_chat_template(
            messages[:-1], tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=True
        )
    assert full.startswith(prompt)
    rest = full[len(prompt) :]
    cut = rest.index("<|im_end|>") + len("<|im_end|>")
    parts = [(encode(tok, prompt), False), (encode(tok, rest[:cut]), True), (encode(tok, rest[cut:]), False)]
    ids = [i for p, _ in parts for i in p]
    targets = [t for p, t in parts for _ in p]
    return ids, targets


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_last_assistant_turn_targets_equal_prefix_rendering(tok, conv, thinking):
    """Every prefix ending at an assistant turn: the same token ids, and that turn's targets token by token."""
    fmt = chat(tok, thinking)
    messages = CONVERSATIONS[conv]
    for k, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        prefix = messages[: k + 1]
        sample = fmt.sample(WHERE, {"messages": prefix, "tools": tools_of(prefix)})
        ids, targets = last_turn_by_prefix(tok, prefix, thinking)
        assert sample.ids.tolist() == ids
        n_prompt = targets.index(True)
        assert not any(targets[n_prompt:][sum(targets) :])  # one run of targets
        assert sample.targets[n_prompt:].tolist() == targets[n_prompt:]
        shown = tok.decode(sample.ids[n_prompt:][sample.targets[n_prompt:]])
        assert shown.endswith("<|im_end|>")
        if thinking or "</think>" in turn["content"]:  # the model writes the think block; without thinking it is prompt
            assert shown.startswith("<think>")
        else:
            assert "<think>" not in shown


def test_every_assistant_turn_is_a_target_and_nothing_else(tok):
    """Whole conversations (Qwen3-style template): the targets are exactly each assistant reply plus its <|im_end|>."""
    fmt = chat(tok)
    for messages in CONVERSATIONS:
        sample = fmt.sample(WHERE, {"messages": messages, "tools": tools_of(messages)})
        runs, current = [], []
        for i, t in zip(sample.ids.tolist(), sample.targets.tolist(), strict=False):
            if t:
                current.append(i)
            elif current:
                runs.append(tok.decode(current))
                current = []
        replies = [m for m in messages if m["role"] == "assistant"]
        assert len(runs) == len(replies)
        for run, reply in zip(runs, replies, strict=False):
            assert run.endswith("<|im_end|>") and "<|im_start|>" not in run and "user" not in run.split("\n")[0]
            content = reply["content"].split("</think>")[-1].lstrip("\n")
            assert content in run


def test_chatml_whole_conversation_equals_union_of_prefix_renderings(tok):
    """A template whose renders of prefixes are prefixes of the whole: the whole conversation's ids and targets equal
    the prefix-by-prefix computation, token by token, for every turn at once."""
    fmt = chat(load_tokenizer(str(DEMO_CHAT_TOKENIZER_DIR)), template=CHATML)
    template_tok = fmt.tokenizer
    messages = CONVERSATIONS[1]
    sample = fmt.sample(WHERE, {"messages": messages})
    expected = np.zeros(len(sample.ids), dtype=bool)
    for k, turn in enumerate(messages):
        if turn["role"] == "assistant":
            ids, targets = last_turn_by_prefix(template_tok, messages[: k + 1], False)
            assert sample.ids[: len(ids)].tolist() == ids
            expected[: len(ids)] |= np.asarray(targets)
    assert sample.targets.tolist() == expected.tolist()
    assert expected.sum() == sum(
        len(encode(template_tok, m["content"] + "<|im_end|>")) for m in messages if m["role"] == "assistant"
    )


def test_prompt_completion_form_equals_messages(tok):
    fmt = chat(tok)
    a = fmt.sample(WHERE, {"prompt": "Who is Hamlet?", "completion": "A prince of Denmark."})
    b = fmt.sample(WHERE, {"messages": CONVERSATIONS[0]})
    c = fmt.sample(WHERE, {"prompt": CONVERSATIONS[0][:1], "completion": CONVERSATIONS[0][1:]})
    assert (
        a.ids.tolist() == b.ids.tolist() == c.ids.tolist()
        and a.targets.tolist() == b.targets.tolist() == c.targets.tolist()
    )


@pytest.mark.parametrize(
    "record,match",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, r"conversations.jsonl:1 has no assistant turn"),
        (
            {"messages": [{"role": "narrator", "content": "hi"}, {"role": "assistant", "content": "x"}]},
            r"conversations.jsonl:1 turn 0 has role 'narrator'; allowed: system, user, assistant, tool",
        ),
        (
            {"messages": [{"role": "user", "content": ["hi"]}, {"role": "assistant", "content": "x"}]},
            r"conversations.jsonl:1 turn 0 \(user\) has content of type list; content must be a string",
        ),
        ({"conversation": []}, r"data.messages_field: \S*conversations.jsonl:1 has no field 'messages'"),
        (
            {"prompt": "q", "completion": 3},
            r"prompt/completion: \S*conversations.jsonl:1: prompt and completion must both be strings",
        ),
    ],
)
def test_bad_conversations_are_one_line_errors(tok, tmp_path, record, match):
    path = tmp_path / "conversations.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError, match=match) as err:
        chat(tok).sample(Location(path, 0), record)
    assert "\n" not in str(err.value)


def test_tokenizer_without_chat_template_is_refused():
    with pytest.raises(DataError, match=r"data.tokenizer: plain has no chat template"):
        ChatFormat(DataConfig(format="chat"), load_tokenizer(None), "plain")


# A template whose role headers are plain text: a user may quote one, and only turns tell the two apart.
PLAIN_HEADERS = (
    "{% for m in messages %}{{ '### ' + m.role + ':\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant:\\n' }}{% endif %}"
)


def target_runs(tok, sample):
    runs, current = [], []
    for i, t in zip(sample.ids.tolist() + [None], sample.targets.tolist() + [False], strict=False):
        if t:
            current.append(i)
        elif current:
            runs.append(tok.decode(current))
            current = []
    return runs


def test_targets_follow_turns_when_a_user_quotes_the_assistant_header():
    """The user quotes the assistant's header twice: the targets are still exactly each reply (prefix-by-prefix
    oracle, token by token), none of the user's text."""
    fmt = chat(load_tokenizer(str(DEMO_CHAT_TOKENIZER_DIR)), template=PLAIN_HEADERS)
    template_tok = fmt.tokenizer
    messages = [
        {"role": "user", "content": "Finish this transcript:\n### assistant:\nI am a quoted reply."},
        {"role": "assistant", "content": "Understood."},
        {"role": "user", "content": "Again: ### assistant:\nquoted"},
        {"role": "assistant", "content": "Done."},
    ]
    sample = fmt.sample(WHERE, {"messages": messages})
    expected = np.zeros(len(sample.ids), dtype=bool)
    for k in (1, 3):
        ids, targets = last_turn_by_prefix(template_tok, messages[: k + 1], False)
        assert sample.ids[: len(ids)].tolist() == ids
        expected[: len(ids)] |= np.asarray(targets)
    assert sample.targets.tolist() == expected.tolist()
    assert target_runs(template_tok, sample) == ["Understood.<|im_end|>", "Done.<|im_end|>"]


def test_every_turn_of_a_multi_turn_conversation_with_earlier_reasoning(tok):
    """Qwen3's template drops an earlier reply's reasoning once a later user turn follows: that reply's targets are what
    the whole conversation renders for it; the last reply's are as its prefix renders it."""
    messages = [
        {"role": "user", "content": "Who wrote it?"},
        {"role": "assistant", "content": "<think>\nThe title.\n</think>\n\nShakespeare."},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "Yes."},
    ]
    assert target_runs(tok, chat(tok).sample(WHERE, {"messages": messages})) == [
        "Shakespeare.<|im_end|>",
        "Yes.<|im_end|>",
    ]
    assert target_runs(tok, chat(tok, thinking=True).sample(WHERE, {"messages": messages})) == [
        "Shakespeare.<|im_end|>",
        "<think>\n\n</think>\n\nYes.<|im_end|>",
    ]


@pytest.mark.parametrize(
    "turn,field,token",
    [
        ({"role": "user", "content": "Say: <|im_start|>assistant\nhello"}, "content", "<|im_start|>"),
        ({"role": "assistant", "content": "An end <|im_end|> inside the answer."}, "content", "<|im_end|>"),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "find_line", "arguments": {"play": "x<|endoftext|>"}}}
                ],
            },
            "tool_calls[0].function.arguments.play",
            "<|endoftext|>",
        ),
    ],
)
def test_special_token_text_inside_a_turn_is_refused_naming_record_and_field(tok, tmp_path, turn, field, token):
    messages = [{"role": "user", "content": "q"}, turn] + (
        [] if turn["role"] == "assistant" else [{"role": "assistant", "content": "a"}]
    )
    record = {"messages": messages, "tools": tools_of(messages)}
    path = tmp_path / "conversations.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError) as err:
        chat(tok).sample(Location(path, 0), record)
    assert str(err.value) == (
        f"data.messages_field (messages): {path}:1 turn 1 ({turn['role']}) {field} holds the "
        f"special token text {token!r}; special tokens may not appear inside a turn (they are the chat "
        "template's own markers)"
    )
    assert (
        chat(tok)
        .sample(
            WHERE,
            {
                "messages": [
                    {"role": "user", "content": "Say: <|im start|> and </think> plainly"},
                    {"role": "assistant", "content": "<think> is not special"},
                ]
            },
        )
        .targets.any()
    )
