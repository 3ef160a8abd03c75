"""Packing's promise, checked on the installed transformers: attention never crosses a document of a packed row.

Rows packed by document carry no attention mask, only position ids that restart at every document; transformers
turns those into a block-diagonal mask (``masking_utils.find_packed_sequence_indices``), which versions before it
do not. ``check_packed_attention`` runs a one-layer Qwen3 on a row of two documents and compares the second's
logits with that document run alone: a run that packs refuses to start where they differ.
"""

from __future__ import annotations

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

from train.front.config import ConfigError

_FIRST, _SECOND = [3, 1, 4, 1, 5], [9, 2, 6]


def documents_stay_apart(attn_implementation: str) -> bool:
    """Whether the second document of a packed row (position ids restarting) gets the logits it gets alone."""
    config = Qwen3Config(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=16,
        use_cache=False,
    )
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).float().eval()
    row = torch.tensor([_FIRST + _SECOND])
    positions = torch.tensor([list(range(len(_FIRST))) + list(range(len(_SECOND)))])
    with torch.no_grad():
        packed = model(input_ids=row, position_ids=positions).logits[:, len(_FIRST) :]
        alone = model(input_ids=torch.tensor([_SECOND])).logits
    return torch.allclose(packed, alone, rtol=1e-4, atol=1e-5)


def check_packed_attention(attn_implementation: str) -> None:
    """Refuse (one line) to train on packed rows where the installed transformers lets attention cross documents."""
    if not documents_stay_apart(attn_implementation):
        raise ConfigError(
            f"data.pack=documents: transformers {transformers.__version__} ({attn_implementation} attention) lets a "
            "packed row's documents attend to each other (no block-diagonal mask from position ids); install "
            "the transformers version of pyproject.toml, or train text with data.pack=stream"
        )
