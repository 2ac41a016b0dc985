"""Text samples from the trained model at the end of a run, through the model spec's ``generate``
(a family without one gets no samples). Every rank calls: generation is a collective under tensor
parallelism; rank 0 prints them."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nxd.specs import ModelSpec
from nxd_training.config.plan import tokenizer_path
from nxd_training.config.schema import DataConfig, GenerationConfig


def generate_samples(gen: GenerationConfig | None, data: DataConfig, seed: int, model: Any,
                     spec: ModelSpec) -> list[str]:
    """Greedy (or sampled, ``gen.do_sample``) continuations of ``gen.prompts`` with ``data``'s tokenizer."""
    path = tokenizer_path(data)
    generate = spec.generate
    if gen is None or not gen.prompts or path is None or generate is None:
        return []
    from nxd_data.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(path)
    # the prompt and the sampling generator live where the model does
    param = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
    device = param.device if param is not None else torch.device("cpu")
    generator = torch.Generator(device=device).manual_seed(seed)
    texts = []
    for prompt in gen.prompts:
        ids = tokenizer.encode(prompt)
        if tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
            ids = [tokenizer.bos_id, *ids]
        prompt_ids = torch.tensor([ids], dtype=torch.long, device=device)
        out = generate(model, prompt_ids, gen.max_new_tokens, do_sample=gen.do_sample, temperature=gen.temperature, top_k=gen.top_k, eos_token_id=tokenizer.eos_id, generator=generator)
        new = [t for t in out[0, len(ids):].tolist() if t != tokenizer.eos_id]
        texts.append(prompt + tokenizer.decode(new))
    if not dist.is_initialized() or dist.get_rank() == 0:
        print("\n--- samples ---", flush=True)
        for text in texts:
            print(repr(text), flush=True)
    return texts
