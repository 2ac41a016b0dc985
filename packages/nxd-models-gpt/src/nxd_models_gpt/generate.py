"""Greedy decoding (no KV cache: each step re-runs the prefix) and full-vocabulary logits."""

from __future__ import annotations

import torch
from torch import nn

from nxd_core_parallel.parallel_layers import gather_from_tensor_model_parallel_region
from nxd_models_gpt.hf_io import unwrap_model


def gather_vocab_logits(model: nn.Module, vocab_parallel_logits: torch.Tensor) -> torch.Tensor:
    """Full logits over the real vocabulary (padding dropped) from each TP rank's slice."""
    full = gather_from_tensor_model_parallel_region(vocab_parallel_logits)
    return full[..., : unwrap_model(model).config.vocab_size]


@torch.no_grad()
def generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """``input_ids`` followed by ``max_new_tokens`` greedy tokens (collective over TP)."""
    module = unwrap_model(model)
    was_training = module.training
    module.eval()
    try:
        ids = input_ids
        for _ in range(max_new_tokens):
            if module.sequence_parallel:
                raise ValueError("generate: build the model without sequence parallelism for decoding")
            logits = gather_vocab_logits(module, module(ids).logits[:, -1:])
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids
    finally:
        module.train(was_training)
