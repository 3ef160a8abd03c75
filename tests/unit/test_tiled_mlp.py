"""Tiled MLP: the same outputs and gradients as transformers' Qwen3 MLP over the whole sequence, tiles or not; the
config refuses it where it cannot apply."""

import pytest
import torch
from train_helpers import TINY
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

from train.front.config import ConfigError, load_config
from train.tiled_mlp import tile_mlp


@pytest.mark.parametrize("tokens", [1, 3, 7, 16, 64])
def test_tiles_compute_the_whole_sequence_s_mlp(tokens):
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=16, intermediate_size=40, hidden_act="silu")
    oracle, tiled = Qwen3MLP(config).double(), Qwen3MLP(config).double()
    tiled.load_state_dict(oracle.state_dict())
    tile_mlp(tiled, tokens)
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = oracle(xa), tiled(xb)
    torch.testing.assert_close(yb, ya, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(ya)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-12, atol=1e-12)
    for (name, pa), pb in zip(oracle.named_parameters(), tiled.parameters(), strict=True):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-12, atol=1e-12, msg=name)
    assert [n for n, _ in tiled.named_parameters()] == [n for n, _ in oracle.named_parameters()]


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["tiled_mlp=4096", "parallel.tp=2"], "parallel.tp > 1"),
        (["tiled_mlp=4096", "model.shape=tiny-moe"], "MoE"),
        (["tiled_mlp=-1"], "tiled_mlp"),
    ],
)
def test_tiled_mlp_is_refused_where_it_cannot_apply(overrides, words):
    with pytest.raises(ConfigError, match=words):
        load_config(TINY, overrides)
