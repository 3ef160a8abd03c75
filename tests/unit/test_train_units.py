"""Pure pieces of the trainer: learning-rate schedule, FLOPs per token, fused linear cross-entropy, one rank's master
weights, checkpointed layers, checkpoint discovery and retention."""

from __future__ import annotations

import json
import math

import pytest
import torch

from train.checkpoint import META, complete_checkpoints, prune, step_dir
from train.loop import lr_at
from train.loss import linear_cross_entropy
from train.metrics import MetricsLog, flops_per_token
from train.parallel import checkpointed_layers
from train.precision import MasterWeights


def test_lr_schedule_warmup_then_cosine():
    lr, warm, floor, total = 1e-3, 10, 1e-4, 110
    assert lr_at(1, lr, warm, floor, total) == pytest.approx(1e-4)
    assert lr_at(10, lr, warm, floor, total) == pytest.approx(lr)
    assert lr_at(60, lr, warm, floor, total) == pytest.approx((lr + floor) / 2)
    assert lr_at(110, lr, warm, floor, total) == pytest.approx(floor)
    values = [lr_at(s, lr, warm, floor, total) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert lr_at(1, lr, 0, floor, 1) == pytest.approx(floor)


def test_flops_per_token_formula():
    # Qwen3-0.6B at seq 4096: 6 x (non-embedding + lm_head) + 12 x layers x heads x head_dim x seq.
    params = {"active_non_embedding": 440_000_000, "lm_head": 151936 * 1024}
    expected = 6 * (440_000_000 + 151936 * 1024) + 12 * 28 * 16 * 128 * 4096
    assert flops_per_token(params, 28, 16, 128, 4096) == expected
    assert math.isclose(expected / 1e9, 6.3, rel_tol=0.05)


def _fake_checkpoint(root, step, files=None):
    d = step_dir(root, step)
    d.mkdir()
    files = {"__0_0.distcp": b"x" * 10, ".metadata": b"meta"} if files is None else files
    for name, data in files.items():
        (d / name).write_bytes(data)
    (d / META).write_text(json.dumps({"step": step, "files": {n: len(b) for n, b in files.items()}}))
    return d


def test_latest_complete_checkpoint_ignores_tmp_and_unmarked(tmp_path):
    for step in (5, 10, 15):
        _fake_checkpoint(tmp_path, step)
    (tmp_path / "step-00000020.tmp").mkdir()  # crashed while saving
    step_dir(tmp_path, 25).mkdir()  # renamed but never marked complete
    (_fake_checkpoint(tmp_path, 30) / "__0_0.distcp").write_bytes(b"x" * 3)  # a shard shorter than its manifest says
    (_fake_checkpoint(tmp_path, 35) / ".metadata").unlink()  # a file of its manifest is missing
    step_dir(tmp_path, 40).mkdir()
    (step_dir(tmp_path, 40) / META).write_text("{}")  # no manifest
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [5, 10, 15]
    assert complete_checkpoints(tmp_path / "missing") == []
    assert prune(tmp_path, keep_last=2) == [step_dir(tmp_path, 5)]
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [10, 15]


def test_linear_cross_entropy_matches_full_logits():
    """Chunked loss and gradients equal cross_entropy on the full logits (fp32, a chunk size that leaves a
    remainder)."""
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = (0.3 * torch.randn(50, 16)).requires_grad_()
    labels = torch.randint(0, 50, (37,))
    ref = torch.nn.functional.cross_entropy(hidden @ weight.t(), labels)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, labels, chunk=8)
    grads = torch.autograd.grad(0.5 * loss, (hidden, weight))
    assert torch.allclose(loss, ref, atol=1e-6)
    for g, r in zip(grads, ref_grads, strict=False):
        assert torch.allclose(2 * g, r, atol=1e-6)


def test_linear_cross_entropy_of_a_frozen_head_gives_only_the_hidden_gradient():
    """A frozen head (LoRA's) gets no gradient, and the hidden states' gradient is still cross_entropy's."""
    torch.manual_seed(1)
    hidden = torch.randn(21, 16, requires_grad=True)
    weight = 0.3 * torch.randn(50, 16)
    labels = torch.randint(0, 50, (21,))
    (ref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(hidden @ weight.t(), labels), (hidden,))
    loss = linear_cross_entropy(hidden, weight, labels, chunk=8)
    loss.backward()
    assert weight.grad is None and torch.allclose(hidden.grad, ref, atol=1e-6)


def test_checkpointed_layers_fraction():
    assert checkpointed_layers(4, 1.0) == {0, 1, 2, 3}
    assert checkpointed_layers(4, 0.0) == set()
    assert len(checkpointed_layers(36, 0.75)) == 27


def test_master_weights_accumulate_in_fp32_and_cast_back():
    """Each backward's bf16 gradients are added in fp32 into the master and freed at once; a step's result is cast
    into the model."""
    torch.manual_seed(0)
    master = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
    mw = MasterWeights(model, master)
    mw.copy_to_model()
    plain.load_state_dict(model.state_dict())
    assert all(
        torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(model.parameters(), master.parameters(), strict=False)
    )
    expected = [torch.zeros_like(m) for m in master.parameters()]
    for _ in range(3):
        x = torch.randn(4, 8, dtype=torch.bfloat16)
        model(x).square().sum().backward()
        plain(x).square().sum().backward()
        for e, p in zip(expected, plain.parameters(), strict=False):
            e += p.grad.float()
        plain.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in model.parameters())
    assert all(
        m.grad.dtype == torch.float32 and torch.equal(m.grad, e)
        for m, e in zip(master.parameters(), expected, strict=False)
    )
    torch.optim.SGD(master.parameters(), lr=0.1).step()
    mw.copy_to_model()
    assert all(
        torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(model.parameters(), master.parameters(), strict=False)
    )
    with pytest.raises(ValueError, match="same parameters"):
        MasterWeights(model, torch.nn.Linear(8, 8))


def test_a_resume_trims_metrics_by_a_new_file_and_keeps_unreadable_lines_aside(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": 1, "loss": 2.0}),
        json.dumps({"step": 2, "loss": 1.5}),
        '{"step": 3, "lo',
        json.dumps({"step": 3, "loss": 1.2}),
    ]
    path.write_text("\n".join(lines) + "\n")
    inode = path.stat().st_ino
    log = MetricsLog(
        tmp_path, True, 1, 10, tokens_per_step=1, flops_per_token=1.0, peak_flops_total=None, resume_step=2
    )
    log.close()
    assert path.read_text().splitlines() == lines[:2]
    assert path.stat().st_ino != inode  # replaced, not rewritten in place
    assert (tmp_path / "metrics.jsonl.unreadable").read_text() == lines[2] + "\n"
    assert "line 3 is not a metrics record; kept in metrics.jsonl.unreadable" in capsys.readouterr().out


def test_jobs_status_names_the_checkpoints_set_aside(tmp_path):
    from hpc.jobs import checkpoint_lines

    ckpt = tmp_path / "ck"
    for name in ("step-00000003", "step-00000006.bad-20261205-101010", "step-00000009", "step-00000012.tmp-ab12"):
        (ckpt / name).mkdir(parents=True)
    (tmp_path / "config.yaml").write_text(f"log: {{dir: {tmp_path}}}\ncheckpoint: {{dir: {ckpt}}}\n")
    assert checkpoint_lines(tmp_path) == [
        f"checkpoints {ckpt}: steps 3, 9",
        "set aside as damaged (1, see WHY.txt in each): step-00000006.bad-20261205-101010",
    ]
    assert checkpoint_lines(tmp_path / "nowhere") == []
