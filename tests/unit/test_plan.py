"""Layout planner: Qwen3 sizes, the memory model's choices, the CLI and hpc.submit's use of it."""

import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT
from train_helpers import FP8_SITE, TINY

from hpc.plan import (
    LOSS_CHUNK_TOKENS,
    Adapters,
    PlanError,
    Shape,
    memory,
    plan,
    plan_layout,
    qwen3_shape,
    report,
    tp_choices,
)
from hpc.site import load_site
from train.front.config import load_config

# the model cards' totals and non-embedding counts, in billions
PUBLISHED = {
    "0.6B": (0.6, 0.44),
    "1.7B": (1.7, 1.4),
    "4B": (4.0, 3.6),
    "8B": (8.2, 6.95),
    "14B": (14.8, 13.2),
    "32B": (32.8, 31.2),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_counts_match_the_model_cards(name):
    s = qwen3_shape(name)
    total, body = PUBLISHED[name]
    assert s.params / 1e9 == pytest.approx(total, rel=0.03)
    assert s.layers * s.layer_params / 1e9 == pytest.approx(body, rel=0.03)


def test_unknown_model_is_an_error():
    with pytest.raises(PlanError, match="--model 70B: allowed: 0.6B, 1.7B, 4B, 8B, 14B, 32B"):
        qwen3_shape("70B")


def test_tp_divides_gpus_per_node_and_kv_heads():
    s8 = qwen3_shape("8B")
    assert tp_choices(s8, 8) == [1, 2, 4, 8]
    assert tp_choices(s8, 4) == [1, 2, 4]
    assert tp_choices(s8, 6) == [1, 2]  # 3 and 6 do not divide 8 KV heads
    four_kv = Shape("x", 1024, 4, 12, 4, 64, 3072, 1000, True)
    assert tp_choices(four_kv, 8) == [1, 2, 4]


def test_memory_model_moves_the_right_way():
    s, tokens = qwen3_shape("8B"), 4096
    base = memory(s, 1, 16, False, tokens, 141)
    assert memory(s, 2, 8, False, tokens, 141).act_gb < base.act_gb  # TP splits activations
    assert memory(s, 1, 16, True, tokens, 141).act_gb < base.act_gb / 5  # checkpointing keeps layer inputs only
    assert memory(s, 1, 32, False, tokens, 141).state_gb < base.state_gb  # more nodes: FSDP shards further
    assert memory(s, 1, 16, False, 2 * tokens, 141).act_gb == pytest.approx(2 * base.act_gb)
    assert base.budget_gb == pytest.approx(141 * 0.9)


def test_loss_memory_is_one_chunk_of_logits_as_the_trainer_computes_it():
    CHUNK_TOKENS = LOSS_CHUNK_TOKENS  # train/front/interface.py: the trainer's loss and the planner share it
    s = qwen3_shape("8B")
    one, eight = memory(s, 1, 16, False, CHUNK_TOKENS, 141), memory(s, 1, 16, False, 8 * CHUNK_TOKENS, 141)
    assert one.loss_gb == pytest.approx(
        (CHUNK_TOKENS * s.vocab * 4 + 6 * s.vocab * s.hidden + 2 * CHUNK_TOKENS * s.hidden) / 1e9
    )
    assert eight.loss_gb - one.loss_gb == pytest.approx(
        2 * 7 * CHUNK_TOKENS * s.hidden / 1e9
    )  # only the hidden states' gradient grows
    assert eight.act_gb == pytest.approx(8 * one.act_gb)


def test_smallest_tp_then_checkpointing_only_when_needed():
    p = plan(qwen3_shape("8B"), 2, 8, 141, 4096, 1)
    assert (p.chosen.tp, p.chosen.dp, p.chosen.ac) == (1, 16, False)
    p = plan(qwen3_shape("32B"), 2, 8, 80, 4096, 1)
    assert (p.chosen.tp, p.chosen.ac) == (1, True)
    assert not p.candidates[0].fits  # tp=1 without checkpointing is over the budget
    p = plan(qwen3_shape("32B"), 4, 8, 80, 32768, 1)
    assert (p.chosen.tp, p.chosen.dp, p.chosen.ac) == (2, 16, True)
    assert all(not c.fits for c in p.candidates if c.tp == 1)


def test_bf16_master_weights_halve_the_state():
    """One 141 GB GPU: an 8B with fp32 master state does not fit at all; with bf16 it fits without checkpointing."""
    with pytest.raises(PlanError, match="with fp32 master weights"):
        plan(qwen3_shape("8B"), 1, 1, 141, 4096, 1)
    p = plan(qwen3_shape("8B"), 1, 1, 141, 4096, 1, master_dtype="bf16")
    assert (p.chosen.tp, p.chosen.dp, p.chosen.ac) == (1, 1, False)
    assert p.chosen.state_gb == pytest.approx(memory(qwen3_shape("8B"), 1, 1, False, 4096, 141).state_gb / 2)


def test_nothing_fits_says_how_many_nodes_would():
    with pytest.raises(PlanError) as e:
        plan(qwen3_shape("32B"), 1, 8, 80, 4096, 1)
    assert "Qwen3-32B does not fit 1 node(s) x 8 GPU(s) of 80 GB" in str(e.value) and "it fits from 2" in str(e.value)


@pytest.mark.parametrize(
    "site,gpus,tp_line",
    [
        ("ib-h200", 8, "inside a node at 480 GB/s: 10 ms; across nodes at 360 GB/s: 13 ms (x1.3)"),
        ("roce-h100", 8, "inside a node at 450 GB/s"),
        ("eth-a100", 4, "across nodes at 10 GB/s: 483 ms (x20.0)"),
    ],
)
def test_report_explains_the_choice(site, gpus, tp_line):
    prof = load_site(site)
    part = prof.partition(None)
    text = report(plan(qwen3_shape("8B"), 2, gpus, part.gpu_memory_gb, 4096, 1), prof, part)
    assert f"2 node(s) x {gpus} GPU(s)" in text and "<- chosen" in text and tp_line in text
    assert f"proposal: dp={2 * gpus} x tp=1, activation checkpointing off  ->  parallel.tp=1" in text


def test_trainer_config_gets_the_plan_only_without_a_layout(tmp_path):
    site = load_site("roce-h100")
    part = site.partition(None)
    tiny = str(ROOT / "train" / "configs" / "tiny.yaml")
    assert plan_layout(load_config(tiny, ["parallel.tp=2"]), part, 2, 8) == (None, None)
    local = load_site("local")
    assert plan_layout(load_config(tiny), local.partition(None), 2, 2) == (None, None)  # no gpu_memory_gb
    layout, note = plan_layout(load_config(tiny, ["optim.lr=1e-3"]), part, 2, 8)
    assert layout.overrides() == ["parallel.tp=1"] and note.startswith("planner: dp=16 x tp=1")

    demo = str(ROOT / "train" / "configs" / "demo.yaml")  # sets parallel.tp itself
    assert plan_layout(load_config(demo), part, 2, 8) == (None, None)

    big = yaml.safe_load(Path(tiny).read_text())
    big.update(model={"shape": "32B"}, seq_len=4096, micro_batch=1)
    cfg = tmp_path / "big.yaml"
    cfg.write_text(yaml.safe_dump(big))
    layout, note = plan_layout(load_config(str(cfg)), part, 2, 8)
    assert layout.overrides() == ["parallel.tp=1", "activation_checkpointing=true"]
    applied = layout.apply(load_config(str(cfg)))
    assert applied == load_config(str(cfg), layout.overrides())  # as the trainer loads it with the overrides
    with pytest.raises(PlanError, match="Qwen3-32B does not fit 1 node"):
        plan_layout(load_config(str(cfg)), part, 1, 8)


def test_lora_adapter_count_and_nf4_bytes_match_the_trainer():
    """The planner's adapter parameters are those apply_lora creates on the 8B; its NF4 bytes per weight torchao's."""
    sys.path.insert(0, str(FP8_SITE))
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hpc.plan import BASE_B
    from train.adapters import apply_lora, nf4_api, nf4_scaler_block
    from train.front.config import SHAPES, load_config

    _, to_nf4 = nf4_api()
    s = qwen3_shape("8B")
    dims = SHAPES["8B"].model_dump(exclude_none=True)
    dims.pop("rope_theta")
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**dims))
    apply_lora(model, load_config(TINY, ["lora.enabled=true", "lora.r=16"]).lora, torch.float32)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == s.layers * s.adapter_params_per_layer(16)
    w = torch.randn(1024, 1024, dtype=torch.bfloat16)
    q = to_nf4(w, 64, nf4_scaler_block(w.numel()))
    stored = sum(t.numel() * t.element_size() for t in (q.quantized_data, q.quantized_scalers, q.quantization_factor))
    assert stored / w.numel() == pytest.approx(BASE_B["nf4"], rel=0.01)


def test_lora_plans_smallest_layouts():
    from hpc.plan import Adapters

    full = memory(qwen3_shape("8B"), 1, 1, True, 4096, 80)
    lora = memory(qwen3_shape("8B"), 1, 1, True, 4096, 80, lora=Adapters(16))
    assert not full.fits and lora.fits and lora.total_gb < 0.45 * full.total_gb
    assert plan(qwen3_shape("8B"), 1, 1, 80, 4096, 1, lora=Adapters(16)).chosen.dp == 1  # 8B LoRA: one GPU
    assert plan(qwen3_shape("32B"), 1, 1, 80, 4096, 1, lora=Adapters(16, "nf4")).fewest_gpus == 1  # 32B QLoRA: one GPU
    p = plan(qwen3_shape("32B"), 1, 8, 80, 4096, 1, lora=Adapters(16))
    assert p.chosen.fits and p.fewest_gpus == 2  # 32B LoRA bf16: 2 x 80 GB
    with pytest.raises(PlanError, match="an NF4 base .* trains on one GPU"):
        plan(qwen3_shape("32B"), 1, 8, 80, 4096, 1, lora=Adapters(16, "nf4"))


@pytest.fixture
def keep_sigpipe():
    """hpc.plan's main sets SIGPIPE's default action; the test process keeps its own."""
    import signal

    saved = signal.getsignal(signal.SIGPIPE)
    yield
    signal.signal(signal.SIGPIPE, saved)


def test_the_cli_prints_the_plan(capsys, keep_sigpipe):
    from hpc.plan import main

    main(["--site", "ib-h200", "--nodes", "4", "--model", "14B", "--seq-len", "8192"])
    out = capsys.readouterr().out
    assert "plan for Qwen3-14B on site ib-h200, partition gpu: 4 node(s) x 8 GPU(s) of 141 GB, 8192 tokens" in out
    assert "proposal: dp=32 x tp=1" in out


@pytest.mark.parametrize("site, planned", [("ib-h200", True), ("local", False)])
def test_submit_adds_the_plan_on_gpu_sites_only(site, planned, tmp_path, monkeypatch, capsys):
    from hpc.submit import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--site", site, "--nodes", "2", "--dry-run", "--", "--config", str(TINY), "global_batch=32"])
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    if planned:
        assert "planner: dp=16 x tp=1" in err and f"--config {TINY} global_batch=32 parallel.tp=1" in out
    else:
        assert "parallel.tp" not in out and "planner" not in err and f"--config {TINY} global_batch=32" in out


H100_RUN = ROOT / "bench" / "reports" / "gpu_h100_2026-12-06"


@pytest.mark.parametrize(
    "case,model,batch,ac,offload,base",
    [
        ("ours-b2", "8B", 2, False, False, "bf16"),
        ("ours-b4-ac", "8B", 4, True, False, "bf16"),
        ("ours-b4-offload", "8B", 4, True, True, "bf16"),
        ("ours-b8-offload", "8B", 8, True, True, "bf16"),
        ("qlora", "32B", 1, True, False, "nf4"),
    ],
)
def test_the_planners_memory_is_within_10_percent_of_the_measured_peaks(case, model, batch, ac, offload, base):
    """The planner's per-GPU memory against the peaks measured on one H100 (bench/reports/gpu_h100_2026-12-06.md:
    Qwen3-8B LoRA r16 at each memory setting, Qwen3-32B QLoRA), seq 4096, vocab 151936."""
    import json

    if case == "qlora":
        measured = json.loads((H100_RUN / "suite.json").read_text())["results"]["qlora"]["sides"]["ours"]["peak_gib"]
    else:
        measured = next(r for r in json.loads((H100_RUN / "lora.json").read_text())["rows"] if r["case"] == case)[
            "peak_gib"
        ]
    planned = (
        memory(qwen3_shape(model), 1, 1, ac, 4096 * batch, 80, "fp32", Adapters(16, base), offload=offload).total_gb
        * 1e9
        / 2**30
    )
    assert abs(planned - measured) <= 0.1 * measured, (planned, measured)


def test_one_gpu_takes_activation_offload_when_nothing_else_fits():
    """Qwen3-8B LoRA at 8 x 4096 on a 32 GB card: checkpointing alone does not fit, offload does; the trainer accepts
    the overrides the planner adds."""
    p = plan(qwen3_shape("8B"), 1, 1, 32, 4096, 8, lora=Adapters(16))
    assert [c.memory_option for c in p.candidates if c.fits] == ["offload"] and p.chosen.offload
    assert p.chosen.layout.overrides() == ["parallel.tp=1", "activation_checkpointing=true", "activation_offload=true"]
    cfg = load_config(TINY, p.chosen.layout.overrides())
    assert cfg.activation_offload and cfg.activation_checkpointing
    assert not any(
        c.offload for c in plan(qwen3_shape("8B"), 1, 2, 32, 4096, 8, lora=Adapters(16)).candidates
    )  # one GPU only
