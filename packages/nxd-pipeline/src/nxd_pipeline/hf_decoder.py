"""The pipeline contract for Hugging Face decoder-only LMs that do not declare it.

transformers' ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` (and NxD's
``modeling_llama_nxd``, built on them) share one shape: ``<base>.embed_tokens``, the
``<base>.layers`` ``ModuleList``, ``<base>.norm`` and ``lm_head``, ``<base>`` being the model's
``base_model_prefix``. NxD cuts them by FX tracing; nxd runs each stage through the model's own
``forward`` instead, so masks, rotary embeddings, the head and the loss are computed exactly as
the unsplit model computes them, whatever the transformers version:

* first stage: ``forward`` runs until its first decoder layer, which stops it and hands back the
  embedded input (embedding scaling or dropout included);
* every stage: the same stopped ``forward``, with the embedding replaced by the incoming hidden
  state, yields the arguments ``forward`` passes to a decoder layer (mask, positions, rotary
  ``position_embeddings``); the stage's own layers then run with them;
* last stage: ``forward`` with one stand-in layer that returns the incoming hidden state runs
  the final norm, the LM head and the model's loss.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class _Stop(Exception):
    """Raised by the stand-in first layer to end a ``forward`` early with what it was given."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.args, self.kwargs = args, kwargs


#: decoder-layer attributes a model's forward reads to pick per-layer inputs (transformers >= 4.54
#: picks the mask by ``attention_type``: full or sliding window)
_LAYER_ATTRIBUTES = ("attention_type",)


def _unwrap(layer: nn.Module | None) -> nn.Module | None:
    return getattr(layer, "_checkpoint_wrapped_module", layer)  # activation checkpointing's wrapper


def _like(stand_in: nn.Module, layer: nn.Module | None) -> nn.Module:
    layer = _unwrap(layer)
    for name in _LAYER_ATTRIBUTES:
        if layer is not None and hasattr(layer, name):
            setattr(stand_in, name, getattr(layer, name))
    return stand_in


class _StopLayer(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise _Stop(args, kwargs)


class _Constant(nn.Module):
    """Returns a fixed tensor whatever it is called with (as an embedding or as a layer)."""

    def __init__(self, value: torch.Tensor, as_tuple: bool = False) -> None:
        super().__init__()
        self.value, self.as_tuple = value, as_tuple

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (self.value,) if self.as_tuple else self.value


def _without_hidden(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return args[1:], {k: v for k, v in kwargs.items() if k != "hidden_states"}


def hf_decoder_base(model: nn.Module) -> str | None:
    """``base_model_prefix`` of a model shaped like transformers' decoder-only LMs, else None."""
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if isinstance(prefix, str) and prefix else None
    if not isinstance(base, nn.Module) or not isinstance(getattr(model, "lm_head", None), nn.Module):
        return None
    if not all(isinstance(getattr(base, n, None), nn.Module) for n in ("embed_tokens", "layers", "norm")):
        return None
    return prefix


class HFDecoderPipeline:
    """``nxd_pipeline_*`` methods for a transformers-shaped decoder-only LM (see the module doc)."""

    def __init__(self, model: nn.Module, base: str) -> None:
        self.model, self.base = model, base
        #: layer arguments of the current micro-batch (its input_ids) per layer kind
        self._layer_inputs: tuple[Any, dict[Any, tuple[tuple, dict]]] = (None, {})
        self._tuple_outputs = False  # whether this transformers version's decoder layers return tuples

    def nxd_pipeline_layout(self) -> dict[str, Any]:
        b = self.base
        return {"embed": [f"{b}.embed_tokens"], "layers": f"{b}.layers", "head": [f"{b}.norm", "lm_head"]}

    # -- the stages
    def nxd_pipeline_embed(self, **batch: Any) -> torch.Tensor:
        args, kwargs = self._stopped_forward(batch, None, self._first_layer())
        return args[0] if args else kwargs["hidden_states"]

    def nxd_pipeline_layer(self, layer: nn.Module, hidden: torch.Tensor, **batch: Any) -> torch.Tensor:
        args, kwargs = self._layer_args(layer, hidden, batch)
        out = layer(hidden, *args, **kwargs)
        self._tuple_outputs = isinstance(out, tuple)
        return out[0] if self._tuple_outputs else out

    def nxd_pipeline_head(self, hidden: torch.Tensor, **batch: Any) -> Any:
        layer = _like(_Constant(hidden, as_tuple=self._tuple_outputs), self._first_layer())
        with self._swapped(embedding=_Constant(hidden.detach()), layers=nn.ModuleList([layer])):
            return self.model(**self._forward_kwargs(batch))

    # -- helpers
    def _first_layer(self) -> nn.Module | None:
        return next(iter(getattr(self.model, self.base).layers), None)

    def _layer_args(self, layer: nn.Module, hidden: torch.Tensor, batch: dict) -> tuple[tuple, dict]:
        ids = batch.get("input_ids")
        if self._layer_inputs[0] is not ids:  # a new micro-batch
            self._layer_inputs = (ids, {})
        kind = tuple(getattr(_unwrap(layer), n, None) for n in _LAYER_ATTRIBUTES)
        cache = self._layer_inputs[1]
        if kind not in cache:
            cache[kind] = _without_hidden(*self._stopped_forward(batch, _Constant(hidden.detach()), layer))
        return cache[kind]

    def _stopped_forward(self, batch: dict, embedding: nn.Module | None, layer: nn.Module | None) -> tuple[tuple, dict]:
        with self._swapped(embedding=embedding, layers=nn.ModuleList([_like(_StopLayer(), layer)])):
            try:
                self.model(**self._forward_kwargs(batch))
            except _Stop as stop:
                return stop.args, stop.kwargs
        raise RuntimeError(f"{type(self.model).__name__}.forward returned without calling its decoder layers; "
                           "it does not have the transformers decoder-LM shape nxd-pipeline cuts by")

    @staticmethod
    def _forward_kwargs(batch: dict) -> dict:
        kwargs = dict(batch)
        kwargs.setdefault("use_cache", False)
        return kwargs

    @contextmanager
    def _swapped(self, embedding: nn.Module | None, layers: nn.ModuleList):
        base = getattr(self.model, self.base)
        saved = base._modules["embed_tokens"], base._modules["layers"]
        if embedding is not None:
            base._modules["embed_tokens"] = embedding
        base._modules["layers"] = layers
        try:
            yield
        finally:
            base._modules["embed_tokens"], base._modules["layers"] = saved
