"""Llama's ``generate``: the shared decoding loop (``nxd_modeling.generation``) with a KV cache."""

from __future__ import annotations

import torch
from torch import nn

from nxd_modeling.generation import gather_vocab_logits, model_device, sequence_parallel_off
from nxd_models_llama.hf_io import unwrap_model
from nxd_models_llama.modeling import KVCache

__all__ = ["gather_vocab_logits", "generate", "model_device", "sequence_parallel_off"]


def generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, eos_token_id: int | list[int] | None = None,
             use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Append up to ``max_new_tokens`` tokens to ``input_ids`` ``[batch, prompt]`` (collective under
    TP; see :func:`nxd_modeling.generation.decode`). ``use_cache``: feed only the new token and
    keep keys/values, instead of re-running the whole prefix each step."""
    from nxd_modeling.generation import decode

    module = unwrap_model(model)
    cache = KVCache(module.config.num_hidden_layers) if use_cache else None

    def next_logits(tokens: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return module(new if use_cache else tokens, kv_cache=cache).logits[:, -1, :]

    return decode(module, input_ids, max_new_tokens, next_logits, vocab_size=module.config.vocab_size,
                  do_sample=do_sample, temperature=temperature, top_k=top_k, eos_token_id=eos_token_id,
                  generator=generator, context=module.parallel_context)
