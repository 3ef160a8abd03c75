"""Packing by document: rows hold whole samples, positions restart, labels never cross a sample; a packed row's
loss and gradients equal those of its samples run one by one, and transformers' own Qwen3 keeps its documents apart
(the trainer checks this before it packs); the masked fused cross-entropy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

from train.data.formats import Sample
from train.data.packing import IGNORE, START, TARGET, model_inputs, pack
from train.front.config import ConfigError
from train.loss import linear_cross_entropy
from train.model import Qwen3ForTraining
from train.packed_attention import check_packed_attention, documents_stay_apart

SEQ = 16
PAD = 0


def samples(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        targets = rng.random(n) < 0.6
        targets[0] = False
        out.append(Sample(rng.integers(1, 50, n).astype(np.int32), targets))
    return out


def segments(tokens_row, flags_row):
    """The row's segments (start, end) at START flags."""
    starts = list(np.flatnonzero(flags_row & START)) + [len(tokens_row)]
    return list(zip(starts[:-1], starts[1:], strict=False))


def test_rows_hold_every_sample_whole_with_its_targets():
    given = samples([5, 16, 3, 9, 7, 1, 12, 4, 4, 2, 11])
    tokens, flags, stats = pack(given, SEQ, "truncate", PAD)
    without = [s for s in given if not s.targets[1:].any()]  # e.g. the one-token sample: no loss token, left out
    assert stats.no_loss == len(without) >= 1 and min(len(s.ids) for s in without) == 1
    given = [s for s in given if s.targets[1:].any()]
    assert tokens.shape == flags.shape == (stats.rows, SEQ) and tokens.dtype == np.int32 and flags.dtype == np.uint8
    found = []
    for r in range(stats.rows):
        for s, e in segments(tokens[r], flags[r]):
            found.append((tokens[r, s:e].tolist(), ((flags[r, s:e] & TARGET) > 0).tolist()))
    pads = [f for f in found if not any(f[1]) and set(f[0]) == {PAD}]
    docs = sorted(f for f in found if f not in pads)
    assert docs == sorted((s.ids.tolist(), s.targets.tolist()) for s in given)
    assert stats.rows == 5 == -(-sum(len(s.ids) for s in given) // SEQ)  # best fit: no row more than needed here
    assert stats.tokens == sum(len(s.ids) for s in given) and stats.loss_tokens == sum(
        int(s.targets.sum()) for s in given
    )
    assert stats.efficiency(SEQ) == stats.tokens / (5 * SEQ)


def test_overlong_samples_are_truncated_or_dropped():
    given = samples([20, 5, 17])
    _, _, cut = pack(given, SEQ, "truncate", PAD)
    assert (cut.truncated, cut.dropped, cut.samples, cut.tokens) == (2, 0, 3, 16 + 5 + 16)
    _, _, dropped = pack(given, SEQ, "drop", PAD)
    assert (dropped.truncated, dropped.dropped, dropped.samples, dropped.tokens) == (0, 2, 1, 5)


def answer_at_end(n: int, answer: int, seed: int = 0) -> Sample:
    """A chat-like sample: n tokens of which only the last ``answer`` are targets."""
    ids = np.random.default_rng(seed).integers(1, 50, n).astype(np.int32)
    return Sample(ids, np.arange(n) >= n - answer)


def test_a_sample_cut_to_no_loss_token_is_left_out_and_counted():
    given = [answer_at_end(20, 3), answer_at_end(6, 2, seed=1), answer_at_end(18, 2, seed=2)]
    tokens, flags, cut = pack(given, SEQ, "truncate", PAD)
    assert (cut.truncated, cut.no_loss, cut.samples, cut.longest) == (2, 2, 1, 20)
    assert cut.loss_tokens == 2 and tokens[0, :6].tolist() == given[1].ids.tolist()
    assert cut.no_loss_refusal(SEQ, "truncate") == (
        "data.overlong=truncate: 2 of 3 samples have no loss token within seq_len=16 (the longest sample has 20 "
        "tokens), "
        "more than 50% or all; raise seq_len, or set data.overlong=truncate_left (keeps each sample's end: the last "
        "replies) or drop"
    )


def test_truncate_left_keeps_the_end_of_each_sample():
    given = [answer_at_end(20, 3), answer_at_end(6, 2, seed=1), answer_at_end(18, 2, seed=2)]
    tokens, flags, left = pack(given, SEQ, "truncate_left", PAD)
    assert (left.truncated, left.no_loss, left.samples, left.loss_tokens) == (2, 0, 3, 3 + 2 + 2)
    assert left.no_loss_refusal(SEQ, "truncate_left") is None
    rows = {tuple(tokens[r, s:e].tolist()) for r in range(len(tokens)) for s, e in segments(tokens[r], flags[r])}
    assert {tuple(g.ids[-SEQ:].tolist()) for g in given} <= rows


def test_no_loss_refusal_counts_all_and_more_than_half():
    from train.data.packing import PackStats

    assert PackStats(samples=5, no_loss=5).no_loss_refusal(SEQ, "truncate") is None
    assert (
        PackStats(samples=5, no_loss=6)
        .no_loss_refusal(SEQ, "truncate")
        .startswith("data.overlong=truncate: 6 of 11 samples")
    )
    assert PackStats(samples=0, dropped=4).no_loss_refusal(SEQ, "drop").startswith("data.overlong=drop: 0 of 4 samples")
    total = PackStats(longest=7)
    total.add(PackStats(samples=2, longest=30))
    total.add(PackStats(samples=1, longest=9))
    assert (total.samples, total.longest) == (3, 30)


def test_model_inputs_restart_positions_and_keep_labels_inside_samples():
    given = samples([6, 4, 3])
    tokens, flags, _ = pack(given, SEQ, "truncate", PAD)
    input_ids, labels, positions = model_inputs(tokens, flags)
    (row,) = range(len(tokens))
    expected_pos, expected_labels = [], []
    for s, e in segments(tokens[row], flags[row]):
        expected_pos += list(range(e - s))
        seg_targets = (flags[row, s:e] & TARGET) > 0
        expected_labels += [int(tokens[row, i + 1]) if seg_targets[i + 1 - s] else IGNORE for i in range(s, e - 1)] + [
            IGNORE
        ]
    assert positions[row].tolist() == expected_pos
    assert labels[row].tolist() == expected_labels
    assert torch.equal(input_ids, torch.from_numpy(tokens).long())


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_skips_ignored_labels(reduction):
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = (0.3 * torch.randn(50, 16)).requires_grad_()
    labels = torch.randint(0, 50, (37,))
    labels[torch.rand(37) < 0.4] = IGNORE
    ref = F.cross_entropy(hidden @ weight.t(), labels, ignore_index=IGNORE, reduction=reduction)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, labels, chunk=8, reduction=reduction)
    grads = torch.autograd.grad(loss, (hidden, weight))
    assert torch.allclose(loss, ref, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=False):
        assert torch.allclose(g, r, atol=1e-6)


def tiny_model(attn: str) -> Qwen3ForTraining:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        use_cache=False,
    )
    config._attn_implementation = attn
    return Qwen3ForTraining(config).float()


def loss_and_grads(model, input_ids, labels, position_ids=None):
    model.zero_grad()
    extra = {} if position_ids is None else {"position_ids": position_ids}
    logits = model(input_ids=input_ids, **extra).logits
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_row_equals_its_samples_one_by_one(attn):
    """fp32: the packed row's summed loss and every parameter's gradient equal the sums over its samples run alone."""
    model = tiny_model(attn)
    given = samples([7, 5, 3], seed=1)
    tokens, flags, stats = pack(given, SEQ, "truncate", PAD)
    assert stats.rows == 1 and stats.tokens == 15
    input_ids, labels, positions = model_inputs(tokens, flags)
    packed_loss, packed_grads = loss_and_grads(model, input_ids, labels, positions)
    alone_loss, alone_grads = torch.zeros(()), None
    for s in given:
        x, y, p = model_inputs(
            s.ids[None], np.where(s.targets, TARGET, 0).astype(np.uint8)[None] | np.eye(1, len(s.ids), dtype=np.uint8)
        )
        loss, grads = loss_and_grads(model, x, y, p)
        alone_loss += loss
        alone_grads = grads if alone_grads is None else {n: alone_grads[n] + g for n, g in grads.items()}
    print(
        f"{attn}: packed loss {packed_loss.item():.6f} vs one by one {alone_loss.item():.6f}, max |grad diff| "
        f"{max((packed_grads[n] - alone_grads[n]).abs().max().item() for n in packed_grads):.2e}"
    )
    assert torch.allclose(packed_loss, alone_loss, rtol=1e-6, atol=1e-5)
    for n in packed_grads:
        assert torch.allclose(packed_grads[n], alone_grads[n], rtol=1e-5, atol=1e-6), n
    # Without position ids the samples see each other: the loss differs (the test can fail).
    crossed, _ = loss_and_grads(model, input_ids, labels)
    assert not torch.allclose(crossed, alone_loss, rtol=1e-4)


def hf_tiny(attn: str) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        use_cache=False,
    )
    config._attn_implementation = attn
    return Qwen3ForCausalLM(config).float().eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_installed_transformers_keeps_a_packed_rows_documents_apart(attn):
    """transformers' own Qwen3ForCausalLM on a packed row of two documents (position ids restarting, no mask): each
    document's logits equal those of the document run alone, on the installed transformers."""
    model = hf_tiny(attn)
    given = samples([9, 6], seed=2)
    tokens, flags, stats = pack(given, SEQ, "truncate", PAD)
    assert stats.rows == 1
    input_ids, _, positions = model_inputs(tokens, flags)
    with torch.no_grad():
        packed = model(input_ids=input_ids, position_ids=positions).logits[0]
        crossed = model(input_ids=input_ids).logits[0]
    starts = np.flatnonzero(flags[0] & START)
    placed = {tuple(tokens[0, s : s + len(g.ids)].tolist()): s for g in given for s in starts}
    for g in given:
        at = placed[tuple(g.ids.tolist())]
        with torch.no_grad():
            alone = model(input_ids=torch.from_numpy(g.ids).long()[None]).logits[0]
        assert torch.allclose(packed[at : at + len(g.ids)], alone, rtol=1e-5, atol=1e-5), (attn, at)
        if at:  # the document placed second sees the first without position ids: the check can fail
            assert not torch.allclose(crossed[at : at + len(g.ids)], alone, rtol=1e-3, atol=1e-3)
    assert documents_stay_apart(attn)
    check_packed_attention(attn)


def test_trainer_refuses_to_pack_where_attention_crosses_documents(monkeypatch):
    """Where transformers finds no packed documents in position ids (as before its block-diagonal mask), the check
    that every packed run makes first refuses in one line."""
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)
    assert not documents_stay_apart("sdpa")
    with pytest.raises(
        ConfigError,
        match=r"^data.pack=documents: transformers \S+ \(sdpa attention\) lets a packed row's "
        r"documents attend to each other",
    ) as err:
        check_packed_attention("sdpa")
    assert "\n" not in str(err.value)
