"""GPT's ``generate``: the shared decoding loop (``nxd_modeling.generation``); no KV cache,
each step re-runs the prefix (learned positions and RoPE both follow from the full sequence)."""

from __future__ import annotations

import torch
from torch import nn

from nxd.parallel import dim_group
from nxd_modeling import generation
from nxd_models_gpt.hf_io import unwrap_model


def gather_vocab_logits(model: nn.Module, vocab_parallel_logits: torch.Tensor) -> torch.Tensor:
    """Full logits over the real vocabulary (padding dropped) from each TP rank's slice."""
    module = unwrap_model(model)
    return generation.gather_vocab_logits(vocab_parallel_logits, module.config.vocab_size,
                                          dim_group(module.parallel_context, "tp"))


def generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, eos_token_id: int | list[int] | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """``input_ids`` followed by up to ``max_new_tokens`` tokens, greedy or sampled (collective over
    TP; see :func:`nxd_modeling.generation.decode`)."""
    module = unwrap_model(model)

    def next_logits(tokens: torch.Tensor, _new: torch.Tensor) -> torch.Tensor:
        return module(tokens).logits[:, -1, :]

    return generation.decode(module, input_ids, max_new_tokens, next_logits, vocab_size=module.config.vocab_size,
                             do_sample=do_sample, temperature=temperature, top_k=top_k, eos_token_id=eos_token_id,
                             generator=generator, context=module.parallel_context)
