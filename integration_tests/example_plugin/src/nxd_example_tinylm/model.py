"""A one-block causal LM in plain PyTorch, following nxd's model forward contract.

It is written for one device; its parallel plan (:data:`PLAN`, data) says which modules nxd shards
over tensor-parallel ranks, and nxd-core-parallel's ``parallel_plan`` transform applies it."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nxd.specs import ParallelPlan

#: the MLP's first linear is column-parallel (its output rows sharded), the second row-parallel
#: (its input columns sharded, outputs summed over TP); attention, embedding and head stay
#: replicated; a pipeline may cut before the block
PLAN = ParallelPlan(column=("block.mlp.0",), row=("block.mlp.2",), pipeline_blocks=("block",))


@dataclass
class TinyLMConfig:
    vocab_size: int = 128
    hidden_size: int = 32
    num_heads: int = 4


class TinyBlock(nn.Module):
    def __init__(self, config: TinyLMConfig) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(config.hidden_size, config.num_heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, 4 * config.hidden_size), nn.GELU(),
                                 nn.Linear(4 * config.hidden_size, config.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), diagonal=1)
        x = x + self.attn(x, x, x, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(x)


class TinyLM(nn.Module):
    nxd_transformer_layer_classes = (TinyBlock,)
    #: the plan the ``parallel_plan`` transform applies (at TP > 1) to a model carrying it
    nxd_parallel_plan = PLAN

    def __init__(self, config: TinyLMConfig, device: Any = None) -> None:
        # plain: the spec's build passes the config only; the parallel_plan slot shards it (plugin-API 4)
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.block = TinyBlock(config)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, input_ids, labels=None, position_ids=None, attention_mask=None, loss_mask=None):
        logits = self.head(self.block(self.embed(input_ids)))
        loss = None
        if labels is not None:
            per_token = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none", ignore_index=-100)
            mask = (labels.flatten() != -100).float() if loss_mask is None else loss_mask.flatten().float()
            loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
        return SimpleNamespace(loss=loss, logits=logits)
