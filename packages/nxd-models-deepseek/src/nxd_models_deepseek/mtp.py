"""DeepSeek-V3's multi-token prediction (the paper's section 2.2) as transformers and DeepSeek's
checkpoints lay it out: MTP module ``k`` (depth ``k + 1``) combines the previous depth's hidden
state ``h`` (depth 0: the main model's output after its final norm) with the embedding of the token
``k + 1`` places ahead, ``eh_proj([enorm(embed); hnorm(h)])``, runs one more decoder block on it and
normalises the result (``shared_head.norm``); the shared output head turns it into logits for the
token ``k + 2`` places ahead. Its parameters are named ``model.layers.{num_hidden_layers + k}.*`` in
the checkpoint (the block's own names plus ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``).

Sequences keep their length: depth ``k``'s inputs and labels are the batch's shifted ``k`` places
left, the last positions filled (inputs 0, labels -100: no loss). Causal attention keeps the filled
positions out of every real one, so each depth's loss is the paper's (mean over the supervised
positions that have a token ``k`` places ahead)."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from nxd_models_deepseek.config import DeepseekV3Config
from nxd_tensor_parallel.modules.rms_norm import RMSNorm


def shift_left(t: torch.Tensor | None, fill: int) -> torch.Tensor | None:
    """``t`` ``[batch, seq]`` one place left, the last column ``fill``."""
    if t is None:
        return None
    return torch.cat([t[:, 1:], t.new_full((t.shape[0], 1), fill)], dim=1)


def mtp_module(layer_class: type[nn.Module], config: DeepseekV3Config, depth_index: int,
               device: torch.device | str | None = None) -> nn.Module:
    """MTP module ``depth_index``: a decoder block of ``layer_class`` (layer index ``num_hidden_layers +
    depth_index``, so MoE like the last layers) with the MTP pieces added; replicated ``eh_proj``
    (under sequence parallelism its input is the rank's sequence slice: its gradient is summed
    over TP like the norms', :meth:`DeepseekV3ForCausalLM.nxd_parallelized`)."""
    block = layer_class(config, config.num_hidden_layers + depth_index, device)
    norm = partial(RMSNorm, config.hidden_size, eps=config.rms_norm_eps, dtype=config.torch_dtype, device=device)
    block.enorm, block.hnorm = norm(), norm()
    block.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False, dtype=config.torch_dtype,
                              device=device)
    if not block.eh_proj.weight.is_meta:
        nn.init.normal_(block.eh_proj.weight, 0.0, config.initializer_range)
    block.shared_head = nn.Module()
    block.shared_head.norm = norm()
    return block


def mtp_hidden(block: nn.Module, hidden: torch.Tensor, embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
    """One depth: the normalised hidden state the shared head reads (and the next depth takes)."""
    x = block.eh_proj(torch.cat([block.enorm(embeds), block.hnorm(hidden)], dim=-1))
    return block.shared_head.norm(block(x, cos, sin, mask))
