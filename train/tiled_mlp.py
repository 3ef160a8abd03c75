"""Tiled MLP (``tiled_mlp: TOKENS``): a dense decoder layer's MLP runs over the sequence in tiles of that many tokens,
each tile checkpointed, so the MLP's [tokens x intermediate] activations (Qwen3-8B: 12288 wide, 3 of them) exist for
one tile at a time instead of the whole sequence, in the forward and in the backward's recomputation. Each token's
MLP is independent of the others', so the result is the same function; only long sequences gain (a tile of 8192
tokens of Qwen3-8B holds 0.6 GB instead of 9 GB at 128k tokens).

The module keeps its class and parameter names (the forward is replaced on the instance), and the tiles run outside
torch.compile (a compiled layer calls the tiled MLP eagerly).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def tile_mlp(mlp: nn.Module, tokens: int) -> None:
    """Run ``mlp`` over dimension 1 (the sequence) of its input in checkpointed tiles of ``tokens``."""
    plain = mlp.forward

    @torch.compiler.disable
    def tiled(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] <= tokens:
            return plain(x)
        return torch.cat([checkpoint(plain, t, use_reentrant=False) for t in x.split(tokens, dim=1)], dim=1)

    mlp.forward = tiled
