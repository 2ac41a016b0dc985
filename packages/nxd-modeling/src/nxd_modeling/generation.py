"""The decoding loop every model family's ``ModelSpec.generate`` shares (greedy or sampled).

A family supplies only how to get the next position's logits (``next_logits``: with or without a
KV cache); sampling, the TP broadcast of sampled tokens, EOS handling and the sequence-parallel
switch are here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nxd.parallel import ParallelContext, dim_group
from nxd_tensor_parallel.parallel_layers import gather_from_tensor_model_parallel_region

#: (all tokens so far [batch, n], the tokens added since the last call [batch, k]) ->
#: vocab-parallel logits of the last position [batch, vocab / TP]; the first call gets the prompt twice
NextLogits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@contextmanager
def sequence_parallel_off(model: nn.Module) -> Iterator[None]:
    """Run TP layers without sequence parallelism (decoding one token cannot be split over ranks).

    The layers read ``sequence_parallel_enabled`` at call time, so flipping it is enough."""
    saved = [(m, m.sequence_parallel_enabled) for m in model.modules() if hasattr(m, "sequence_parallel_enabled")]
    saved_model = [(m, m.sequence_parallel) for m in model.modules() if "sequence_parallel" in vars(m)]
    try:
        for m, _ in saved:
            m.sequence_parallel_enabled = False
        for m, _ in saved_model:
            m.sequence_parallel = False
        yield
    finally:
        for m, value in saved:
            m.sequence_parallel_enabled = value
        for m, value in saved_model:
            m.sequence_parallel = value


def gather_vocab_logits(vocab_parallel_logits: torch.Tensor, vocab_size: int | None = None,
                        process_group: Any = None) -> torch.Tensor:
    """Full-vocabulary logits from each TP rank's slice over ``process_group`` (the current TP group
    when left out; identity at TP=1), cut to ``vocab_size`` classes when given (drops the TP padding
    of a vocabulary not divisible by the TP size)."""
    logits = gather_from_tensor_model_parallel_region(vocab_parallel_logits, process_group=process_group)
    return logits if vocab_size is None else logits[..., :vocab_size]


def model_device(module: nn.Module) -> torch.device:
    """Where the model's parameters live (CPU for a parameterless module)."""
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def next_token(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
               generator: torch.Generator | None) -> torch.Tensor:
    if not do_sample:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if generator is not None and generator.device != probs.device:  # e.g. a CPU generator, a CUDA model
        return torch.multinomial(probs.to(generator.device), 1, generator=generator).squeeze(-1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def decode(module: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, next_logits: NextLogits, *,
           vocab_size: int | None, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
           eos_token_id: int | list[int] | None = None, generator: torch.Generator | None = None,
           context: ParallelContext | None = None) -> torch.Tensor:
    """Append up to ``max_new_tokens`` tokens to ``input_ids`` ``[batch, prompt]`` (same-length prompts),
    for a model built for ``context`` (its TP group gathers the logits; ``None``: no model parallelism).

    Collective under TP: every TP rank calls it with the same prompt and gets the same tokens
    (sampled tokens come from TP rank 0). Sequences that emit ``eos_token_id`` are padded with it;
    decoding stops early once all have. Returns ``[batch, prompt + generated]``."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, prompt_length], got shape {tuple(input_ids.shape)}")
    device = model_device(module)  # prompts may be built on the CPU: every tensor follows the model
    tokens = input_ids.to(device)
    eos = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []), dtype=torch.long,
                       device=device)
    tp_group = dim_group(context, "tp")
    was_training = module.training
    module.eval()
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=device)
    try:
        with sequence_parallel_off(module):
            new = tokens
            for _ in range(max_new_tokens):
                logits = gather_vocab_logits(next_logits(tokens, new), vocab_size, tp_group)
                nxt = next_token(logits, do_sample, temperature, top_k, generator)
                if do_sample and tp_group is not None and dist.get_world_size(tp_group) > 1:
                    dist.broadcast(nxt, context.tp.src_rank, group=tp_group)
                if eos.numel():
                    nxt = torch.where(finished, eos[0], nxt)
                    finished |= torch.isin(nxt, eos)
                new = nxt[:, None]
                tokens = torch.cat([tokens, new], dim=1)
                if eos.numel() and bool(finished.all()):
                    break
    finally:
        module.train(was_training)
    return tokens
