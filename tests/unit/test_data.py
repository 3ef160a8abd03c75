"""Data pipeline: corpus loading, token cache, demo tokenizer, and the packed-block stream."""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pydantic
import pytest
import torch

from hpc.node.cli import HpcError
from train.data import DEMO_CORPUS, DataConfig, TokenStream, load_tokenizer, load_tokens

DOCS = ["To be, or not to be, that is the question.", "Now is the winter of our discontent\nMade glorious summer."]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def demo_tokens(tok):
    return load_tokens(DataConfig(), tok)


def expected_tokens(tok, docs):
    ids = []
    for doc in docs:
        ids += tok(doc, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return torch.tensor(ids, dtype=torch.int64)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def one_line_error(match, fn, *args, **kwargs):
    with pytest.raises(HpcError, match=match) as err:
        fn(*args, **kwargs)
    assert "\n" not in str(err.value)


# ---- tokenizer -------------------------------------------------------------------------


def test_demo_tokenizer_round_trips_and_has_eos(tok):
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id is not None
    assert len(tok) == 2048
    text = "O Romeo, Romeo! wherefore art thou Romeo?\n\n  Café, naïve — 日本語 🙂\t123"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert tok("<|endoftext|>", add_special_tokens=False)["input_ids"] == [tok.eos_token_id]


def test_load_tokenizer_rejects_non_tokenizer_dir(tmp_path):
    one_line_error("tokenizer: .* not a Hugging Face tokenizer directory", load_tokenizer, str(tmp_path))


# ---- loading ---------------------------------------------------------------------------


def test_jsonl_loading_with_custom_field_and_blank_lines(tmp_path, tok):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"body": DOCS[0], "id": 1}) + "\n\n" + json.dumps({"body": DOCS[1]}) + "\n")
    tokens = load_tokens(DataConfig(path=str(path), text_field="body"), tok)
    assert tokens.dtype == torch.int64 and tokens.dim() == 1
    assert torch.equal(tokens, expected_tokens(tok, DOCS))


def test_txt_file_is_one_document(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(DOCS))
    assert torch.equal(load_tokens(DataConfig(path=str(path)), tok), expected_tokens(tok, ["\n\n".join(DOCS)]))


def test_demo_corpus_has_all_works(tok, demo_tokens):
    tokens = demo_tokens
    assert int((tokens == tok.eos_token_id).sum()) == sum(1 for _ in DEMO_CORPUS.open()) == 16
    assert tokens[-1] == tok.eos_token_id
    assert tok.decode(tokens[:8]).startswith("HAMLET")


def test_datasets_directory(tmp_path, tok):
    datasets = pytest.importorskip("datasets")  # in the test extra

    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "ds"))
    assert torch.equal(load_tokens(DataConfig(path=str(tmp_path / "ds")), tok), expected_tokens(tok, DOCS))


def test_datasets_directory_without_datasets_is_a_clear_error(tmp_path, tok, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails as when it is not installed
    one_line_error(r"data.path: .* needs the `datasets` package", load_tokens, DataConfig(path=str(tmp_path)), tok)


def test_bad_inputs_are_one_line_errors(tmp_path, tok):
    def load(path):
        return load_tokens(DataConfig(path=str(path)), tok)

    one_line_error("data.path: .*missing.jsonl does not exist", load, tmp_path / "missing.jsonl")
    bad_suffix = tmp_path / "c.csv"
    bad_suffix.write_text("text\n")
    one_line_error(r"data.path: .* suffix '.csv'; allowed: .jsonl, .txt", load, bad_suffix)
    no_field = write_jsonl(tmp_path / "f.jsonl", [{"text": "ok"}, {"content": "no text"}])
    one_line_error(r"data.text_field: .*f.jsonl:2 has no string field 'text'", load, no_field)
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"text": "ok"}\n{"text": \n')
    one_line_error(r"data.path: .*b.jsonl:2 is not valid JSON", load, broken)
    with pytest.raises(pydantic.ValidationError):
        DataConfig(paths="x.jsonl")


# ---- cache -----------------------------------------------------------------------------


def test_cache_hit_returns_identical_tensor(tmp_path, tok):
    cfg = DataConfig(path=str(write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS])))
    cache = tmp_path / "cache"
    first = load_tokens(cfg, tok, str(cache))
    (cached,) = cache.iterdir()
    second = load_tokens(cfg, tok, str(cache))
    assert torch.equal(first, second) and second.dtype == torch.int64
    # The hit really reads the file: a tensor planted under the same key comes back.
    torch.save(torch.arange(5), cached)
    assert torch.equal(load_tokens(cfg, tok, str(cache)), torch.arange(5))


def test_cache_key_follows_source_and_tokenizer(tmp_path, tok):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS])
    cache = tmp_path / "cache"
    load_tokens(DataConfig(path=str(path)), tok, str(cache))
    write_jsonl(path, [{"text": DOCS[0]}])
    changed = load_tokens(DataConfig(path=str(path)), tok, str(cache))
    assert torch.equal(changed, expected_tokens(tok, DOCS[:1]))
    other_tok = load_tokenizer(None)
    other_tok.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    load_tokens(DataConfig(path=str(path)), other_tok, str(cache))
    assert len(list(cache.iterdir())) == 3


def test_concurrent_callers_share_one_cache_file(tmp_path, tok):
    cfg = DataConfig(path=str(write_jsonl(tmp_path / "c.jsonl", [{"text": d * 50} for d in DOCS * 20])))
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: load_tokens(cfg, tok, str(cache)), range(8)))
    assert all(torch.equal(r, results[0]) for r in results)
    assert [p.name.startswith("tokens-") and p.suffix == ".pt" for p in cache.iterdir()] == [True]
    assert oct(os.stat(next(cache.iterdir())).st_mode & 0o777) == "0o644"


# ---- stream ----------------------------------------------------------------------------

SEQ = 7  # blocks of 8 tokens; with arange tokens, block b starts at token 8 * b


def stream(num_blocks=50, global_batch=8, micro_batch=2, dp_rank=0, dp_size=1, seed=0, extra_tokens=3):
    tokens = torch.arange(num_blocks * (SEQ + 1) + extra_tokens, dtype=torch.int64)
    return TokenStream(tokens, SEQ, global_batch, micro_batch, dp_rank, dp_size, seed)


def global_step(streams):
    """Advance every rank's stream one step; return the step's block ids in rank order."""
    ids = []
    for s in streams:
        s.next_microbatches()
        ids += s.last_sample_ids
    return ids


def test_microbatches_are_shifted_blocks():
    s = stream(global_batch=8, micro_batch=2, dp_rank=1, dp_size=2)
    mbs = s.next_microbatches()
    assert len(mbs) == 2 and len(s.last_sample_ids) == 4
    blocks = torch.tensor(s.last_sample_ids)
    for i, (inputs, labels) in enumerate(mbs):
        assert inputs.shape == labels.shape == (2, SEQ) and inputs.dtype == labels.dtype == torch.int64
        start = blocks[2 * i : 2 * i + 2, None] * (SEQ + 1)
        assert torch.equal(inputs, start + torch.arange(SEQ))
        assert torch.equal(labels, start + 1 + torch.arange(SEQ))


def test_same_seed_same_blocks_different_seed_different_order():
    a, b, c = stream(seed=1), stream(seed=1), stream(seed=2)
    for _ in range(8):
        ma, mb = a.next_microbatches(), b.next_microbatches()
        assert all(torch.equal(x, y) for pa, pb in zip(ma, mb, strict=False) for x, y in zip(pa, pb, strict=False))
    assert [global_step([stream(seed=1)]) for _ in range(6)] != [global_step([c]) for _ in range(6)]


def test_union_over_dp_ranks_equals_single_process():
    single = stream(num_blocks=50, global_batch=12, micro_batch=3)
    ranks = [stream(num_blocks=50, global_batch=12, micro_batch=1, dp_rank=r, dp_size=4) for r in range(4)]
    for _ in range(10):  # 4 steps per epoch: crosses two epoch boundaries
        assert global_step(ranks) == global_step([single])


def test_epoch_drops_incomplete_final_batch_and_reshuffles():
    s = stream(num_blocks=50, global_batch=8)
    assert s.steps_per_epoch == 6
    first = [i for _ in range(6) for i in global_step([s])]
    assert len(set(first)) == 48 and s.state_dict()["epoch"] == 0
    second = [i for _ in range(6) for i in global_step([s])]
    assert s.state_dict()["epoch"] == 1 and len(set(second)) == 48 and first != second


def test_resume_same_layout_continues_identically():
    ref = [stream(dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(4):
        global_step(ref)
    resumed = [stream(dp_rank=r, dp_size=2) for r in range(2)]
    for s, r in zip(resumed, ref, strict=False):
        s.load_state_dict(r.state_dict())
    for _ in range(10):
        outs = [s.next_microbatches() for s in ref]
        res = [s.next_microbatches() for s in resumed]
        assert all(
            torch.equal(x, y)
            for a, b in zip(outs, res, strict=False)
            for pa, pb in zip(a, b, strict=False)
            for x, y in zip(pa, pb, strict=False)
        )


@pytest.mark.parametrize("before,after", [(1, 4), (4, 2), (2, 8)])
def test_resume_under_other_dp_size_neither_repeats_nor_skips(before, after):
    g, steps, switch = 16, 20, 7  # 100 blocks -> 6 steps per epoch; run spans 4 epochs
    reference = [stream(num_blocks=100, global_batch=g, micro_batch=1)]
    expected = [global_step(reference) for _ in range(steps)]

    first = [stream(num_blocks=100, global_batch=g, micro_batch=2, dp_rank=r, dp_size=before) for r in range(before)]
    seen = [global_step(first) for _ in range(switch)]
    state = first[0].state_dict()
    assert all(s.state_dict() == state for s in first)
    second = [stream(num_blocks=100, global_batch=g, micro_batch=1, dp_rank=r, dp_size=after) for r in range(after)]
    for s in second:
        s.load_state_dict(state)
    seen += [global_step(second) for _ in range(steps - switch)]

    assert seen == expected
    for epoch in range(3):  # within each full epoch every trained block is distinct
        ids = [i for step in seen[6 * epoch : 6 * epoch + 6] for i in step]
        assert len(ids) == len(set(ids)) == 96


@pytest.mark.parametrize("global_batch,dp,micro", [(10, 4, 2), (16, 12, 4), (5, 8, 2), (7, 3, 1)])
def test_any_dp_takes_the_whole_global_batch_once(global_batch, dp, micro):
    """Whatever dp, the ranks' rows are exactly the single process's global batch, each row once, every rank runs as
    many micro-batches of at most micro_batch rows, and the padding ones count no loss token."""
    single = stream(num_blocks=50, global_batch=global_batch, micro_batch=global_batch)
    ranks = [
        stream(num_blocks=50, global_batch=global_batch, micro_batch=micro, dp_rank=r, dp_size=dp) for r in range(dp)
    ]
    for _ in range(8):
        micro_batches = [s.next_microbatches() for s in ranks]
        single.next_microbatches()
        assert [i for s in ranks for i in s.last_sample_ids] == single.last_sample_ids
        assert len({len(m) for m in micro_batches}) == 1
        for s, mbs in zip(ranks, micro_batches, strict=True):
            real = mbs[: len(mbs) - s.last_padding]
            assert all(len(inputs) <= micro for inputs, _ in mbs)
            assert sum(len(inputs) for inputs, _ in real) == len(s.last_sample_ids)
            assert all((labels != -100).all() for _, labels in real)
            assert all((labels == -100).all() for _, labels in mbs[len(real) :])
        assert sum(len(m) - s.last_padding for m, s in zip(micro_batches, ranks, strict=True)) == min(
            global_batch, dp * len(micro_batches[0])
        )


def test_stream_validation_errors():
    one_line_error(r"corpus too small: .* fewer than global_batch=64", stream, num_blocks=50, global_batch=64)
    one_line_error(r"dp_rank=2 must be in \[0, dp_size=2\)", stream, dp_rank=2, dp_size=2)
    s = stream()
    state = s.state_dict() | {"seq_len": SEQ + 1}
    one_line_error("data state seq_len=8 does not match", s.load_state_dict, state)


def test_demo_corpus_streams(tok, demo_tokens):
    s = TokenStream(demo_tokens, 256, 8, 2, 0, 2, seed=0)
    (inputs, labels), _ = s.next_microbatches()
    assert inputs.shape == (2, 256) and int(inputs.max()) < len(tok)
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
