"""Named parts of a model's loss, reported beside it for logging (the step contract's ``loss_terms``).

A model output may carry ``loss_terms``: a dict of scalar tensors naming what its ``loss`` is made
of, e.g. ``{"lm_loss": ..., "aux_loss": ..., "z_loss": ...}`` for a mixture-of-experts model (each
term before its coefficient). A Hugging Face MoE output (``MoeCausalLMOutputWithPast``) carries
no such dict but an ``aux_loss``: it is reported as ``aux_loss``. Nothing here changes the loss
that is trained; the terms are detached.
"""

from __future__ import annotations

from typing import Any

import torch


def _field(output: Any, name: str) -> Any:
    if isinstance(output, dict):  # a plain dict, or a transformers ModelOutput (a dict too)
        return output.get(name)
    return getattr(output, name, None)


def loss_terms_of(output: Any) -> dict[str, torch.Tensor]:
    """The named loss terms of one model output (empty for a bare loss tensor or an output with none)."""
    if isinstance(output, torch.Tensor):
        return {}
    terms = _field(output, "loss_terms")
    if terms is None:
        aux = _field(output, "aux_loss")
        return {"aux_loss": aux} if isinstance(aux, torch.Tensor) else {}
    if not isinstance(terms, dict):
        raise TypeError(f"{type(output).__name__}.loss_terms must be a dict of scalar tensors, got {type(terms).__name__}")
    for name, value in terms.items():
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"{type(output).__name__}.loss_terms[{name!r}] must be a scalar tensor, got "
                            f"{type(value).__name__}{tuple(value.shape) if isinstance(value, torch.Tensor) else ''}")
    return terms


def add_loss_terms(sums: dict[str, torch.Tensor], output: Any) -> None:
    """Add ``output``'s loss terms (detached, fp32) into ``sums``, by name."""
    for name, value in loss_terms_of(output).items():
        value = value.detach().float().reshape(())
        sums[name] = sums[name] + value if name in sums else value
