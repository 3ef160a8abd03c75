"""Activation offload: a checkpointed layer whose input waits in host memory gives the plain model's loss and
gradients bit for bit (LoRA with dropout: the recomputation replays the forward's random state; the first layer's
adapters train though the frozen embedding's output needs no gradient), and the settings it needs are one-line
errors."""

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from train_helpers import TINY

from train.data.tokenizer import load_tokenizer
from train.front.config import ConfigError, LoraConfig, ModelConfig, ParallelConfig, load_config
from train.front.layout import ParallelDims, WorldEnv
from train.front.run_check import offload_problem
from train.model import build_meta_model, hf_config, load_initial_weights
from train.parallel import build_mesh, parallelize

CPU = torch.device("cpu")


def _grads(offload: bool, checkpointing: bool):
    config = hf_config(ModelConfig(shape="tiny"), load_tokenizer(None))
    mesh = build_mesh(ParallelDims.build(ParallelConfig(), WorldEnv(0, 0, 1, 1), kv_heads=2), CPU)
    lora = LoraConfig(enabled=True, r=4, alpha=8, dropout=0.1)
    model = parallelize(
        build_meta_model(config),
        mesh,
        activation_checkpointing=checkpointing,
        compile=False,
        param_dtype=torch.float32,
        lora=lora,
        offload_to=CPU if offload else None,
    )
    load_initial_weights(model, ModelConfig(shape="tiny"), config, seed=0, device=CPU)
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    loss = model(input_ids=ids, labels=ids)
    loss.backward()
    wrapped = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
    return (
        loss.detach(),
        {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters() if p.requires_grad},
        wrapped,
    )


def test_offloaded_layers_give_the_plain_models_loss_and_gradients(one_rank):
    loss, grads, wrapped = _grads(offload=True, checkpointing=True)
    plain_loss, plain, none = _grads(offload=False, checkpointing=False)
    assert wrapped == 2 and none == 0
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain.keys() and any("layers.0." in n for n in grads)
    for name, g in grads.items():
        assert g is not None and torch.equal(g, plain[name]), name


def test_offload_needs_checkpointing_and_one_rank():
    with pytest.raises(
        ConfigError,
        match=r"\(with overrides activation_offload=true\): activation_offload=true offloads the inputs that "
        r"checkpointed layers keep: set activation_checkpointing=true",
    ):
        load_config(TINY, ["activation_offload=true"])
    load_config(TINY, ["activation_offload=true", "activation_checkpointing=0.5"])
    cfg = load_config(TINY, ["activation_offload=true", "activation_checkpointing=true"])
    assert offload_problem(cfg, 2).startswith(
        "activation_offload=true trains on one rank (one GPU); this job has WORLD_SIZE=2: "
    )
    assert offload_problem(cfg, 1) is None
