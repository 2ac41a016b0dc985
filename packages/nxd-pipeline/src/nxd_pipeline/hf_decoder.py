"""The pipeline contract for Hugging Face decoder-only LMs that do not declare it.

transformers' ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` (and NxD's
``modeling_llama_nxd`` / ``modeling_mixtral_moe_nxd``, built on them) share one shape:
``<base>.embed_tokens``, the ``<base>.layers`` ``ModuleList``, ``<base>.norm`` and ``lm_head``,
``<base>`` being the model's ``base_model_prefix`` (DBRX names them ``wte``, ``blocks``,
``norm_f``). NxD cuts them by FX tracing; nxd runs each stage through the model's own
``forward`` instead, so masks, rotary embeddings, the head and the loss are computed exactly as
the unsplit model computes them, whatever the transformers version:

* first stage: ``forward`` runs until its first decoder layer, which stops it and hands back the
  embedded input (embedding scaling or dropout included);
* every stage: the same stopped ``forward``, with the embedding replaced by the incoming hidden
  state, yields the arguments ``forward`` passes to a decoder layer (mask, positions, rotary
  ``position_embeddings``); the stage's own layers then run with them. A layer's arguments may
  depend on its kind (its ``attention_type``, or ``config.layer_types[i]`` that Gemma 3 and GPT-OSS
  read by the loop's index): the stopping stand-in sits at the first index of that kind, after
  pass-through stand-ins, and the arguments are computed once per kind and micro-batch;
* last stage: ``forward`` with one stand-in layer that returns the incoming hidden state runs
  the final norm, the LM head and the model's loss.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn

from nxd_pipeline.packing import pack, unpack

#: (embedding, decoder layers, final norm) of a base model: transformers' decoder LMs; DBRX
BASE_MODULE_NAMES = (("embed_tokens", "layers", "norm"), ("wte", "blocks", "norm_f"))
#: the decoder-layer argument through which NxD's MoE examples pass the router logits so far
ROUTER_LOGITS_ARGUMENT = "past_router_logits"

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


def _attributes(layer: nn.Module | None) -> dict[str, Any]:
    layer = _unwrap(layer)
    return {n: getattr(layer, n) for n in _LAYER_ATTRIBUTES if layer is not None and hasattr(layer, n)}


def _like(stand_in: nn.Module, attributes: dict[str, Any]) -> nn.Module:
    for name, value in attributes.items():
        setattr(stand_in, name, value)
    return stand_in


class _StopLayer(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise _Stop(args, kwargs)


class _PassThrough(nn.Module):
    """Stands in for a layer before the stopping one: hands its hidden state on unchanged."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if args else kwargs["hidden_states"]


class _Constant(nn.Module):
    """Returns a fixed tensor (or tuple) whatever it is called with (as an embedding or as a layer)."""

    def __init__(self, value: torch.Tensor | tuple, as_tuple: bool = False) -> None:
        super().__init__()
        self.value, self.as_tuple = value, as_tuple

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (self.value,) if self.as_tuple else self.value


def _without_hidden(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return args[1:], {k: v for k, v in kwargs.items() if k != "hidden_states"}


def _base_names(base: nn.Module) -> tuple[str, str, str] | None:
    for names in BASE_MODULE_NAMES:
        if all(isinstance(getattr(base, n, None), nn.Module) for n in names):
            return names
    return None


def hf_decoder_base(model: nn.Module) -> str | None:
    """``base_model_prefix`` of a model shaped like transformers' decoder-only LMs, else None."""
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if isinstance(prefix, str) and prefix else None
    if not isinstance(base, nn.Module) or not isinstance(getattr(model, "lm_head", None), nn.Module):
        return None
    return prefix if _base_names(base) is not None else None


def threads_router_logits(model: nn.Module, base: str) -> bool:
    """Whether the model's decoder layers take the router logits so far (NxD's MoE examples)."""
    layers = getattr(getattr(model, base), _base_names(getattr(model, base))[1])
    first = next(iter(layers), None)
    return first is not None and ROUTER_LOGITS_ARGUMENT in _layer_signature(first).parameters


def _layer_signature(layer: nn.Module) -> inspect.Signature:
    """The signature of the layer class's own ``forward`` (activation checkpointing may replace the
    instance's ``forward`` by a ``*args, **kwargs`` wrapper)."""
    layer = _unwrap(layer)
    return inspect.signature(partial(type(layer).forward, layer))


class HFDecoderPipeline:
    """``nxd_pipeline_*`` methods for a transformers-shaped decoder-only LM (see the module doc)."""

    def __init__(self, model: nn.Module, base: str) -> None:
        self.model, self.base = model, base
        self.embed_name, self.layers_name, self.norm_name = _base_names(getattr(model, base))
        #: router logits travel with the hidden state (module doc); stage outputs are then packed
        self.carries_router_logits = threads_router_logits(model, base)
        #: per global layer index, before pruning: the attributes the forward reads off a layer, and
        #: its kind (those attributes and ``config.layer_types[i]``; one kind: the same arguments)
        layers = getattr(getattr(model, base), self.layers_name)
        self._attributes = [_attributes(layer) for layer in layers]
        types = getattr(getattr(model, "config", None), "layer_types", None) or ()
        self._kinds = [(tuple(sorted(a.items())), types[i] if i < len(types) else None)
                       for i, a in enumerate(self._attributes)]
        #: layer arguments of the current micro-batch (its input_ids) per layer kind
        self._layer_inputs: tuple[Any, dict[Any, tuple[tuple, dict]]] = (None, {})
        self._tuple_outputs = False  # whether this transformers version's decoder layers return tuples

    def nxd_pipeline_layout(self) -> dict[str, Any]:
        b = self.base
        return {"embed": [f"{b}.{self.embed_name}"], "layers": f"{b}.{self.layers_name}",
                "head": [f"{b}.{self.norm_name}", "lm_head"]}

    # -- the stages
    def nxd_pipeline_embed(self, **batch: Any) -> torch.Tensor:
        args, kwargs = self._stopped_forward(batch, None, 0)
        hidden = args[0] if args else kwargs["hidden_states"]
        return pack([hidden, None]) if self.carries_router_logits else hidden

    def nxd_pipeline_layer(self, layer: nn.Module, hidden: torch.Tensor, **batch: Any) -> torch.Tensor:
        router_logits = None
        if self.carries_router_logits:
            hidden, router_logits = unpack(hidden)
        args, kwargs = self._layer_args(layer, hidden, batch)
        if not self.carries_router_logits:
            out = layer(hidden, *args, **kwargs)
            self._tuple_outputs = isinstance(out, tuple)
            return out[0] if self._tuple_outputs else out
        call = _layer_signature(layer).bind(hidden, *args, **kwargs)
        call.arguments[ROUTER_LOGITS_ARGUMENT] = router_logits
        out = layer(*call.args, **call.kwargs)
        self._tuple_outputs = True
        # with output_router_logits the layer's last output is the router logits so far, its own included
        return pack([out[0], out[-1] if call.arguments.get("output_router_logits") else router_logits])

    def nxd_pipeline_head(self, hidden: torch.Tensor, **batch: Any) -> Any:
        if self.carries_router_logits:
            hidden, router_logits = unpack(hidden)
            outputs = (hidden,) if router_logits is None else (hidden, router_logits)
            layer = _like(_Constant(outputs), (self._attributes or [{}])[0])
        else:
            layer = _like(_Constant(hidden, as_tuple=self._tuple_outputs), (self._attributes or [{}])[0])
        with self._swapped(embedding=_Constant(hidden.detach()), layers=nn.ModuleList([layer])):
            return self.model(**self._forward_kwargs(batch))

    # -- helpers
    def _index_of(self, layer: nn.Module) -> int:
        """``layer``'s global index (the layer container, pruned or not, is keyed by it)."""
        layers = getattr(getattr(self.model, self.base), self.layers_name)
        for key, module in layers._modules.items():
            if module is layer:
                return int(key)
        raise ValueError(f"{type(layer).__name__} is not one of {type(self.model).__name__}'s decoder layers")

    def _layer_args(self, layer: nn.Module, hidden: torch.Tensor, batch: dict) -> tuple[tuple, dict]:
        ids = batch.get("input_ids")
        if self._layer_inputs[0] is not ids:  # a new micro-batch
            self._layer_inputs = (ids, {})
        kind = self._kinds[self._index_of(layer)]
        cache = self._layer_inputs[1]
        if kind not in cache:
            first = self._kinds.index(kind)  # where the forward's loop gives this kind's arguments
            cache[kind] = _without_hidden(*self._stopped_forward(batch, _Constant(hidden.detach()), first))
        return cache[kind]

    def _stopped_forward(self, batch: dict, embedding: nn.Module | None, index: int) -> tuple[tuple, dict]:
        """The arguments ``forward`` passes to its layer ``index`` (pass-through layers before it)."""
        stand_ins = [_like(_PassThrough(), a) for a in self._attributes[:index]]
        stand_ins.append(_like(_StopLayer(), self._attributes[index] if self._attributes else {}))
        with self._swapped(embedding=embedding, layers=nn.ModuleList(stand_ins)):
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
        saved = base._modules[self.embed_name], base._modules[self.layers_name]
        if embedding is not None:
            base._modules[self.embed_name] = embedding
        base._modules[self.layers_name] = layers
        try:
            yield
        finally:
            base._modules[self.embed_name], base._modules[self.layers_name] = saved
