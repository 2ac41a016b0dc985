"""``neuronx_distributed.modules.lora.layer``: NxD's per-layer LoRA wrappers, on nxd-lora's adapter.

``LoraModel`` adapts a model through nxd-lora (an adapter beside each targeted layer, base names
unchanged). These classes are NxD's standalone form: ``LoraLinear(base_layer, lora_config)`` holds
``base_layer`` and computes ``base_layer(x) + scale * B(A(dropout(x)))`` with nxd-lora's adapter (PEFT's
math and initialisation), merges and unmerges as NxD's do. Their parameters are nxd-lora's
(``adapter.pieces.<name>.lora_A``), not NxD's ``lora_A.weight`` modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nxd_compat.surface import NotProvidedError
from nxd_lora import LoraConfig
from nxd_lora.layers import LoraAdapter
from nxd_lora.model import shared_init_generator
from nxd_lora.naming import slots_for, tp_size_rank

__all__ = ["LoraConv2d", "LoraEmbedding", "LoraLayer", "LoraLinear"]


class LoraLayer(nn.Module):
    """One base layer with its LoRA adapter (NxD's base class; ``accepts``: the base layers a subclass wraps)."""

    accepts: tuple[type, ...] = ()

    def __init__(self, base_layer: nn.Module, lora_config: LoraConfig) -> None:
        if not isinstance(base_layer, self.accepts):
            raise TypeError(f"{type(self).__name__} wraps {' or '.join(c.__name__ for c in self.accepts)}, "
                            f"got {type(base_layer).__name__}")
        super().__init__()
        self.base_layer = base_layer
        self.lora_config = lora_config
        self.lora_rank = lora_config.lora_rank
        self.lora_alpha = lora_config.lora_alpha
        self.scaling = lora_config.scaling
        tp, rank = tp_size_rank(getattr(base_layer, "parallel_context", None))
        slots = slots_for("base_layer", base_layer, None, tp, rank)
        self.adapter = LoraAdapter(base_layer, slots, [True] * len(slots), lora_config, shared_init_generator())
        self._originals: dict[str, torch.Tensor] = {}

    @property
    def merged(self) -> bool:
        return self.adapter.merged

    def get_base_layer(self) -> nn.Module:
        return self.base_layer

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self.adapter.apply(self.base_layer, x, self.base_layer(x, *args, **kwargs))

    def get_delta_weight(self) -> torch.Tensor | list[torch.Tensor]:
        """``merged weight - base weight`` per base weight parameter (one tensor, or q/k/v's)."""
        merged = self.adapter.merged_weights(self.base_layer)
        deltas = [merged[name] - weight.detach() for name, weight, _ in self.adapter.weight_params(self.base_layer)]
        return deltas[0] if len(deltas) == 1 else deltas

    @torch.no_grad()
    def merge(self, safe_merge: bool = False) -> None:
        if self.adapter.merged:
            return
        for name, new in self.adapter.merged_weights(self.base_layer).items():
            if safe_merge and not torch.isfinite(new).all():
                raise ValueError("NaNs detected in the merged weights. The adapter seems to be broken")
            weight = getattr(self.base_layer, name)
            self._originals[name] = weight.detach().clone()
            weight.copy_(new)
        self.adapter.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Restore the base weights exactly (NxD subtracts the update, which rounds)."""
        if not self.adapter.merged:
            return
        for name, original in self._originals.items():
            getattr(self.base_layer, name).copy_(original)
        self._originals.clear()
        self.adapter.merged = False

    def __repr__(self) -> str:
        return "lora." + super().__repr__()


class LoraLinear(LoraLayer):
    accepts = (nn.Linear,)

    def __init__(self, base_layer: nn.Module, lora_config: LoraConfig, is_conv_1d_layer: bool = False) -> None:
        if is_conv_1d_layer:
            raise NotProvidedError("neuronx_distributed.modules.lora.layer.LoraLinear(is_conv_1d_layer=True) (NxD) is "
                                   "not provided by nxd-compat: nxd-lora adapts nn.Linear, the TP layers, convolutions "
                                   "and embeddings, not transformers' Conv1D (GPT-2's layers)")
        super().__init__(base_layer, lora_config)


class LoraConv2d(LoraLayer):
    accepts = (nn.Conv2d,)


class LoraEmbedding(LoraLayer):
    accepts = (nn.Embedding,)
