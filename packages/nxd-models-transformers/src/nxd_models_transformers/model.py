"""transformers' own causal-LM class, with nxd's model contract added by a thin subclass.

The subclass changes no module and no parameter name (``save_pretrained``'s layout is the model's
own); it only gives ``forward`` nxd's meaning: ``labels`` aligned with ``input_ids`` (nxd's data
modules shift them, transformers shifts again), ``loss_mask``, no KV cache while training."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nxd_modeling.lm_loss import causal_lm_loss

#: transformers class -> its nxd subclass (one per class, so ``isinstance`` and FSDP's wrapping see one type)
_SUBCLASSES: dict[type, type] = {}


class NxdCausalLMMixin:
    """nxd's ``forward(input_ids, labels, position_ids, attention_mask, loss_mask)`` over a
    transformers ``*ForCausalLM`` (first in the MRO of :func:`nxd_class`'s subclasses)."""

    #: set per subclass from the built model: the decoder-layer classes (FSDP units, full recompute)
    nxd_transformer_layer_classes: tuple[type, ...] = ()

    def forward(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        kwargs.pop("segment_ids", None)  # packed samples: their [b, 1, s, s] attention_mask says it
        if attention_mask is not None and attention_mask.dim() == 4 and sliding_layers(self.config):
            raise ValueError(f"{type(self).__name__}: a packed-sequence (4-D) attention mask would replace this model's "
                             "sliding-window masks; train it on unpacked sequences")
        kwargs.setdefault("use_cache", False)
        out = super().forward(input_ids=input_ids, position_ids=position_ids,  # type: ignore[misc]
                              attention_mask=attention_mask, **kwargs)
        if labels is not None:
            # the LM head gathers whole logits on every TP rank (transformers' colwise_gather_output)
            loss = causal_lm_loss(out.logits, labels, loss_mask, None)
            aux = getattr(out, "aux_loss", None)
            if aux is not None:
                loss = loss + self.config.router_aux_loss_coef * aux
            out.loss = loss
        return out


    def nxd_parallelized(self, context: Any) -> None:
        """Called by the TP plan's ``parallelize`` after its swap: an attention whose K/V projections
        hold their heads replicated on m ranks (``kv_size_multiplier``) has m times fewer query heads
        per local K/V head (transformers' ``repeat_kv`` reads ``num_key_value_groups``)."""
        for module in self.modules():
            m = max((int(getattr(c, "kv_size_multiplier", 1) or 1) for c in module.children()), default=1)
            if m > 1 and isinstance(getattr(module, "num_key_value_groups", None), int):
                module.num_key_value_groups //= m


def sliding_layers(config: Any) -> bool:
    """Whether some layer of ``config``'s model attends through a sliding window."""
    types = getattr(config, "layer_types", None) or ()
    return any("sliding" in str(t) for t in types) or bool(getattr(config, "sliding_window", None)
                                                          and getattr(config, "use_sliding_window", True)
                                                          and not types)


def nxd_class(hf_class: type) -> type:
    """The subclass of transformers' ``hf_class`` with nxd's forward (same name, same modules)."""
    cls = _SUBCLASSES.get(hf_class)
    if cls is None:
        cls = type(hf_class.__name__, (NxdCausalLMMixin, hf_class), {"__module__": __name__,
                                                                    "__qualname__": hf_class.__name__})
        _SUBCLASSES[hf_class] = cls
    return cls


def decoder_layer_classes(model: nn.Module) -> tuple[type, ...]:
    """The classes of ``model``'s decoder layers (``_no_split_modules`` found in the built model)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: dict[type, None] = {}
    for module in model.modules():
        if type(module).__name__ in names:
            found[type(module)] = None
    return tuple(found)


def whole_on_meta(model: nn.Module) -> nn.Module:
    """``model``'s class at its config on the meta device: the whole model's parameter names and
    shapes, which a pipeline stage (holding only its own layers) no longer has."""
    with torch.device("meta"):
        return type(model)._from_config(model.config)
