"""model.rope_scaling: YaRN past Qwen3's native 32k, as transformers builds it from Qwen's own rope_scaling form."""

from __future__ import annotations

import pytest
import torch
from train_helpers import TINY
from transformers import AutoTokenizer, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from train.front.config import ConfigError, load_config
from train.front.tokenizer import tokenizer_source
from train.model import hf_config

YARN = ["model.rope_scaling.factor=4.0", "model.rope_scaling.original_max_position_embeddings=32768"]
POSITIONS = torch.tensor([[0, 1, 4095, 32767, 32768, 65536, 131071]])


def _cos_sin(config) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(1, POSITIONS.shape[1], 1, dtype=torch.float32)
    return Qwen3RotaryEmbedding(config)(x, POSITIONS)


def test_yarn_rotary_embedding_equals_transformers_own():
    cfg = load_config(TINY, ["model.shape=8B", "seq_len=131072", *YARN])
    ours = hf_config(cfg.model, AutoTokenizer.from_pretrained(tokenizer_source(None, None, False)))
    assert ours.max_position_embeddings == 131072
    # the form of Qwen's model card (config.json's rope_scaling), which transformers turns into its rope parameters
    theirs = Qwen3Config(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=1e6,
        max_position_embeddings=131072,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )
    (cos, sin), (ref_cos, ref_sin) = _cos_sin(ours), _cos_sin(theirs)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    plain = hf_config(
        load_config(TINY, ["model.shape=8B"]).model, AutoTokenizer.from_pretrained(tokenizer_source(None, None, False))
    )
    plain_cos, _ = _cos_sin(plain)
    assert (plain_cos - cos).abs().max() > 0.1  # scaling changes the rotation (the test can fail)
    assert Qwen3RotaryEmbedding(ours).attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["seq_len=131073", *YARN], "seq_len=131073 is beyond model.rope_scaling's reach: factor x "),
        (["model.rope_scaling.factor=1.0", YARN[1]], "model.rope_scaling.factor=1.0: Input should be greater than 1"),
        (
            ["model.rope_scaling.rope_type=linear", *YARN],
            "model.rope_scaling.rope_type='linear': Input should be 'yarn'",
        ),
        ([YARN[0]], "model.rope_scaling.original_max_position_embeddings is required"),
    ],
)
def test_bad_rope_scaling_is_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
