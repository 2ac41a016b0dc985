"""A tiny pipeline-able language model: the reference implementation of the model contract in
docs/pipeline.md, used by the tests and the benchmark."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class ToyBlock(nn.Module):
    """Pre-norm residual MLP block (stands in for a transformer layer)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.down(F.gelu(self.up(self.norm(hidden))))


class ToyLM(nn.Module):
    """embedding -> ``num_layers`` blocks -> norm -> head -> mean cross-entropy."""

    nxd_transformer_layer_classes = (ToyBlock,)

    def __init__(self, vocab_size: int = 32, hidden: int = 16, num_layers: int = 4, tie_embeddings: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(ToyBlock(hidden) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight

    # -- the pipeline contract
    def nxd_pipeline_layout(self) -> dict[str, Any]:
        return {"embed": ["embed"], "layers": "layers", "head": ["norm", "head"]}

    def nxd_pipeline_embed(self, input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        return self.embed(input_ids)

    def nxd_pipeline_head(self, hidden: torch.Tensor, labels: torch.Tensor, **_: Any) -> torch.Tensor:
        logits = self.head(self.norm(hidden))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    # -- the ordinary (unsplit) forward, written with the same pieces
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.nxd_pipeline_embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return self.nxd_pipeline_head(hidden, labels)


def toy_batch(batch: int, seq: int, vocab_size: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, seq + 1), generator=g)
    return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}
